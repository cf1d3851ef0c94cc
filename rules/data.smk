def tofu_data_files(wildcards):
    """The vendored files the data rule reads (so editing one re-runs everything downstream)."""
    data = config["tofu"]["data"]
    if data["source"] != "local":
        return []
    pct = int(data["split"][-2:])
    names = [
        data["split"],
        f"{data['split']}_perturbed",
        f"retain{100 - pct}",
        "retain_perturbed",
        "real_authors_perturbed",
        "world_facts_perturbed",
        *data.get("knowledge", []),
    ]
    return [str(Path(data["root"]) / f"{n}.jsonl") for n in names]


rule tofu_data:
    input:
        tofu_data_files,
    output:
        **{name: path("data", name=name) for name in DATA_SETS},
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
    log:
        log_path("tofu_data", "exp"),
    threads: 1
    resources:
        **resources_for("light"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/tofu_data.py"
