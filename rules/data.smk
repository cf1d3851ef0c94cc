rule tofu_data:
    input:
        tofu_data_files,
    output:
        **{name: path("data", name=name) for name in DATA_SETS},
    log:
        log_path("tofu_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("tofu_<split>", "size_<shape>"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
        max_forget_questions=config["tofu"]["evaluate"].get("max_forget_questions"),
    script:
        "../workflow_scripts/tofu_data.py"


rule tofu_holdout:
    # The membership-inference non-members: QA of the matching TOFU holdout authors (no training set).
    input:
        tofu_holdout_file,
    output:
        path("data", name="eval_holdout"),
    log:
        log_path("tofu_holdout", "exp"),
    wildcard_constraints:
        exp=exp_pattern("tofu_<split>", "size_<shape>"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
        max_forget_questions=config["tofu"]["evaluate"].get("max_forget_questions"),
    script:
        "../workflow_scripts/tofu_holdout.py"
