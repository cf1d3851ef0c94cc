rule tofu_table:
    # The paper's TOFU table: Model Utility and Forget Quality (KS p-value vs the retain reference).
    input:
        logs=lambda wc: [path("eval", exp=EXP, model=m) for m in eval_models()],
        imported=[m["log"] for m in config["tofu"].get("imported_models", [])],
    output:
        **{
            f"{table}_{ext}": path("table", table=table, ext=ext)
            for table in ("tofu", "tofu_wide")
            for ext in ("csv", "md", "tex")
        },
        truth_ratio=path("figure", name="tofu_truth_ratio"),
    log:
        log_path("tofu_table"),
    conda:
        "../envs/qrerase.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        models=eval_models(),
        reference="retain",
        imported=config["tofu"].get("imported_models", []),
        rank=RANK,
    script:
        "../workflow_scripts/tofu_table.py"
