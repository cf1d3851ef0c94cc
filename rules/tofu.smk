rule tofu_metrics:
    # Per model: Probability, ROUGE-L, Truth Ratio per set, Model Utility, Forget Quality (tidy CSV).
    input:
        unpack(metrics_inputs),
    output:
        path("metrics"),
    log:
        log_path("tofu_metrics", "exp", "model"),
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        name=metrics_name,
    script:
        "../workflow_scripts/tofu_metrics.py"


rule tofu_table:
    # The paper's TOFU table: Model Utility and Forget Quality (KS p-value vs the retain reference);
    # PrivLeak and the Min-K%++ AUC from each eval folder's sequence_metrics.json (the retain reference's too).
    input:
        metrics=[
            path("metrics", exp=TOFU_EXP, model=m)
            for m in [*eval_models(), *imported_models()]
        ],
        logs=[path("eval", exp=TOFU_EXP, model=m) for m in eval_models()],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption=f"../report/{table}_table.rst",
                category="TOFU",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("tofu", "tofu_wide")
            for ext in ("csv", "md", "tex")
        },
        truth_ratio=report(
            path("figure", name="tofu_truth_ratio"),
            caption="../report/truth_ratio.rst",
            category="TOFU",
            subcategory="Figures",
            labels={"figure": "truth ratio"},
        ),
    log:
        log_path("tofu_table"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        rows=[row_key(m) for m in eval_models()],
        reference="retain",
        imported={n: m.get("label", n) for n, m in imported_models().items()},
        controls=CONTROLS,
        rank=RANK,
    script:
        "../workflow_scripts/tofu_table.py"


rule tofu_mia_table:
    # Membership inference (forget vs holdout AUCs), PrivLeak vs the retain reference, extraction
    # strength and exact memorisation of every evaluated model (sequence_metrics.json of rule evaluate).
    input:
        logs=[path("eval", exp=TOFU_EXP, model=m) for m in eval_models()],
    output:
        **{
            ext: report(
                path("table", table="tofu_mia", ext=ext),
                caption="../report/tofu_mia_table.rst",
                category="TOFU",
                subcategory="Tables",
                labels={"table": "tofu_mia", "format": ext},
            )
            for ext in ("csv", "md")
        },
    log:
        log_path("tofu_mia_table"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        rows=[row_key(m) for m in eval_models()],
        controls=CONTROLS,
    script:
        "../workflow_scripts/tofu_mia_table.py"


rule probe:
    # `snakemake probe`: the memorisation probe of the TOFU experiment (rule memorisation_probe).
    input:
        path("probe", exp=TOFU_EXP, which="full"),
