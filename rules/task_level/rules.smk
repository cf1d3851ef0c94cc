# Task-level track (paper Table 1): forget a skill (arithmetic), keep a similar one (maths in words)
# and an unrelated one (multiple-choice knowledge). Experiment "task_level" owns its model: generic
# tokenizer, pretrain (data set `pretrain`: the kept skills, not the forgotten one; task_level.init) and
# finetune rules, then the unchanged lora (task_level.lora.base) -> task_matrices -> factors -> energy ->
# forget_update -> erase_merged chain; baselines GA, KGA, KU by task_level_baseline; its own evaluation
# and table; the lambda / k sweep and the lambda rule on the held-out slice (`snakemake task_level_tradeoff`).


include: "common.smk"


rule task_level_data:
    # Generated skills (deterministic from the seed): forget / retain / new training sets, the
    # fine-tuning mixture and the held-out evaluation sets.
    input:
        task_level_data_files,
    output:
        **{name: path("data", name=name) for name in TASK_LEVEL_DATA_SETS},
    log:
        log_path("task_level_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("task_level"),
    conda:
        "../../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=TASK_LEVEL.get("data"),
        seed=config["seed"],
    script:
        "../../workflow_scripts/task_level/data.py"


rule task_level_baseline:
    # Gradient Ascent (qrerase.baselines.text), KGA or KU (qrerase.tracks.task_level.baselines) from the fine-tuned model.
    input:
        unpack(task_level_baseline_inputs),
    output:
        model=directory(path("baseline_model")),
        curve=path("baseline_curve"),
    log:
        log_path("task_level_baseline", "exp", "method"),
    benchmark:
        benchmark_path("task_level_baseline", "exp", "method")
    wildcard_constraints:
        exp=exp_pattern("task_level"),
        method="|".join(TASK_LEVEL_BASELINES),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "task_level_baseline",
            model=config["model"],
            cfg=lambda wc: stage_params(wc.method, wc.exp),
            engine=lambda wc: engine_params(wc.method, wc.exp),
            max_length=lambda wc: exp_section("finetune", wc.exp).get(
                "max_length", 128
            ),
            seed=config["seed"],
        ),
    shell:
        launch("task_level/baseline.py")


rule task_level_evaluate:
    # Exact-match accuracy of greedy answers and answer-token NLL of one model on each role's eval set.
    input:
        unpack(task_level_checkpoint),
        **{
            f: path("data", name=f)
            for files in TASK_LEVEL_EVAL_FILES.values()
            for f in files
        },
    output:
        path("task_level_eval"),
    log:
        log_path("task_level_evaluate", "exp", "model"),
    wildcard_constraints:
        exp=exp_pattern("task_level"),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=config["model"],
        evaluate=TASK_LEVEL.get("evaluate"),
        roles={r: list(f) for r, f in TASK_LEVEL_EVAL_FILES.items()},
        skills={r: TASK_LEVEL.get("data", {}).get(r) for r in TASK_LEVEL_ROLES},
        seed=config["seed"],
    script:
        "../../workflow_scripts/task_level/evaluate.py"


rule task_level_table:
    # The paper's Table 1 layout: Method x {unrelated, similar, forgotten} accuracy; + NLL (wide).
    input:
        evals=[
            path("task_level_eval", exp=TASK_LEVEL_EXP, model=m)
            for m in task_level_models()
        ],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption="table.rst",
                category="Task-level",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("task_level", "task_level_wide")
            for ext in ("csv", "md", "tex")
        },
        metrics=path("task_level_metrics"),
    log:
        log_path("task_level_table"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        models=task_level_models(),
        skills={r: TASK_LEVEL.get("data", {}).get(r) for r in TASK_LEVEL_ROLES},
        rank=TASK_LEVEL_RANK,
        scale=TASK_LEVEL.get("scale"),
    script:
        "../../workflow_scripts/task_level/table.py"


rule task_level_tradeoff_erase:
    # One subspace method at every (k, lambda) of task_level.tradeoff, erased in-process from the
    # lambda-free factors: the held-out slice's answer NLL and each role's accuracy and NLL per point.
    input:
        unpack(task_level_tradeoff_inputs),
        **{
            f: path("data", name=f)
            for files in TASK_LEVEL_EVAL_FILES.values()
            for f in files
        },
        tune=path("data", name="tune_retain"),
        model=base_model,
    output:
        path("task_level_tradeoff_points"),
    log:
        log_path("task_level_tradeoff_erase", "exp", "method"),
    benchmark:
        benchmark_path("task_level_tradeoff_erase", "exp", "method")
    wildcard_constraints:
        exp=exp_pattern("task_level"),
        method="|".join(DECOMP),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=config["model"],
        evaluate=TASK_LEVEL.get("evaluate"),
        roles={r: list(f) for r, f in TASK_LEVEL_EVAL_FILES.items()},
        skills={r: TASK_LEVEL.get("data", {}).get(r) for r in TASK_LEVEL_ROLES},
        ranks=sorted(TASK_LEVEL_TRADEOFF.get("ranks", [])),
        scales=list(TASK_LEVEL_TRADEOFF.get("scales", [])),
        retain_rank=config["unlearn"]["retain_rank"],
        seed=config["seed"],
    script:
        "../../workflow_scripts/task_level/tradeoff_erase.py"


rule task_level_tradeoff:
    # Target: every sweep point, the lambda rule on the held-out slice tune_retain, and the track's
    # table with each subspace method at its picked lambda (base and baselines as in task_level_table).
    input:
        points=[
            path("task_level_tradeoff_points", exp=TASK_LEVEL_EXP, method=m)
            for m in TASK_LEVEL_METHODS
            if m in DECOMP
        ],
        evals=[
            path("task_level_eval", exp=TASK_LEVEL_EXP, model=m)
            for m in task_level_models()
            if split_model(m)[1] is None
        ],
    output:
        **{
            f"picked_{ext}": path("table", table="task_level_picked", ext=ext)
            for ext in ("csv", "md", "tex")
        },
        csv=path("table", table="task_level_tradeoff", ext="csv"),
        rule_csv=path("table", table="task_level_scale_rule", ext="csv"),
    log:
        log_path("task_level_tradeoff"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        max_rise=TASK_LEVEL_TRADEOFF.get("max_retain_nll_rise", 0.1),
        rank=TASK_LEVEL_RANK,
        models=task_level_models(),
        skills={r: TASK_LEVEL.get("data", {}).get(r) for r in TASK_LEVEL_ROLES},
    script:
        "../../workflow_scripts/task_level/tradeoff.py"
