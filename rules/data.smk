# TOFU track: the data sets of experiment tofu_<split> (qrerase.text.data).
from qrerase.text.data import required_splits

DATA_SETS = [
    "forget",
    "retain",
    "knowledge",
    "finetune_full",
    "finetune_retain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
    "pretrain",
    "tune_retain",
]


def tofu_data_files(wildcards):
    """The vendored files the data rule reads (so editing one re-runs everything downstream)."""
    data = config["tofu"]["data"]
    if data["source"] != "local":
        return []
    names = required_splits(data["split"], data.get("knowledge", []))
    return [str(Path(data["root"]) / f"{n}.jsonl") for n in names]


rule tofu_data:
    input:
        tofu_data_files,
    output:
        **{name: path("data", name=name) for name in DATA_SETS},
    log:
        log_path("tofu_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("tofu_<split>"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
    script:
        "../workflow_scripts/tofu_data.py"
