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
    params:
        models=eval_models(),
        reference="retain",
        imported=config["tofu"].get("imported_models", []),
        rank=RANK,
    log:
        log_path("tofu_table"),
    threads: 1
    resources:
        **resources_for("light"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/tofu_table.py"
