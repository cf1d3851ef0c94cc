# TOFU track (paper §4.1): fictitious-author QA, forget / retain splits of TOFU. Its data (tofu_data,
# tofu_holdout), its metrics and tables; the shared chain (rules/core/: model, lora, task matrices,
# factors, energy, erase, evaluate, the text baselines) runs on its experiments tofu_<split> and size_<shape>.


include: "common.smk"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
        max_forget_questions=config["tofu"]["evaluate"].get("max_forget_questions"),
    script:
        "../../workflow_scripts/tofu/data.py"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=config["tofu"]["data"],
        max_questions=config["tofu"]["evaluate"]["max_questions"],
        max_forget_questions=config["tofu"]["evaluate"].get("max_forget_questions"),
    script:
        "../../workflow_scripts/tofu/holdout.py"


rule tofu_metrics:
    # Per model: Probability, ROUGE-L, Truth Ratio per set, Model Utility, Forget Quality (tidy CSV).
    input:
        unpack(metrics_inputs),
    output:
        path("metrics"),
    log:
        log_path("tofu_metrics", "exp", "model"),
    conda:
        "../../envs/eval.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        name=metrics_name,
    script:
        "../../workflow_scripts/tofu/metrics.py"


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
                caption=f"{table}_table.rst",
                category="TOFU",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("tofu", "tofu_wide")
            for ext in ("csv", "md", "tex")
        },
        truth_ratio=report(
            path("figure", name="tofu_truth_ratio"),
            caption="truth_ratio.rst",
            category="TOFU",
            subcategory="Figures",
            labels={"figure": "truth ratio"},
        ),
    log:
        log_path("tofu_table"),
    conda:
        "../../envs/tables.yaml"
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
        "../../workflow_scripts/tofu/table.py"


rule tofu_mia_table:
    # Membership inference (forget vs holdout AUCs), PrivLeak vs the retain reference, extraction
    # strength and exact memorisation of every evaluated model (sequence_metrics.json of rule evaluate).
    input:
        logs=[path("eval", exp=TOFU_EXP, model=m) for m in eval_models()],
    output:
        **{
            ext: report(
                path("table", table="tofu_mia", ext=ext),
                caption="tofu_mia_table.rst",
                category="TOFU",
                subcategory="Tables",
                labels={"table": "tofu_mia", "format": ext},
            )
            for ext in ("csv", "md")
        },
    log:
        log_path("tofu_mia_table"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        rows=[row_key(m) for m in eval_models()],
        controls=CONTROLS,
    script:
        "../../workflow_scripts/tofu/mia_table.py"


rule probe:
    # `snakemake probe`: the memorisation probe of the TOFU experiment (rule memorisation_probe).
    input:
        path("probe", exp=TOFU_EXP, which="full"),


rule evaluate:
    # TOFU protocol: answer-token losses (gt, paraphrased, perturbed) and greedy ROUGE-L per question;
    # the per-answer MIA / memorisation statistics of the forget and holdout sets (sequence_metrics.json).
    input:
        unpack(eval_model_inputs),
        unpack(eval_data_inputs),
        holdout=lambda wc: path("data", exp=wc.exp, name="eval_holdout"),
    output:
        directory(path("eval")),
    log:
        log_path("evaluate", "exp", "model"),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=config["tofu"]["evaluate"],
        track="tofu",  # its experiments, the size study's too, are this track's
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/core/evaluate.py"


rule memorisation_probe:
    # The memorisation probe (config `probe`, docs/real-model.md): the `finetune` recipe on the full
    # training set for max(probe.epochs) epochs, its greedy answers to the forget set's training
    # questions scored (ROUGE-L recall) after each probed epoch. Reads no evaluation set.
    input:
        unpack(finetune_init_inputs),
        data=path("data", name="finetune_full"),
        forget=path("data", name="forget"),
    output:
        path("probe"),
    log:
        log_path("memorisation_probe", "exp", "which"),
    benchmark:
        benchmark_path("memorisation_probe", "exp", "which")
    wildcard_constraints:
        exp=TOFU_EXPS,
        which="full",
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=lambda wc: exp_model(wc.exp),
        train=lambda wc: exp_section("finetune", wc.exp),
        probe=config["probe"],
        evaluate=config["tofu"]["evaluate"],
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/tofu/memorisation_probe.py"
