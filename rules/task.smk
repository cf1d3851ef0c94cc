# Task-level track (paper Table 1): forget a skill (arithmetic), keep a similar one (maths in words)
# and an unrelated one (multiple-choice knowledge). Experiment "task" owns its model: generic tokenizer
# and finetune rules, then the unchanged lora -> task_matrices -> factors -> energy -> forget_update ->
# erase_merged chain; baselines GA, KGA, KU by task_baseline; its own evaluation and table.


include: "task_common.smk"


rule task_data:
    # Generated skills (deterministic from the seed): forget / retain / new training sets, the
    # fine-tuning mixture and the held-out evaluation sets.
    input:
        task_data_files,
    output:
        **{name: path("data", name=name) for name in TASK_DATA_SETS},
    log:
        log_path("task_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("task"),
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=TASK.get("data"),
        seed=config["seed"],
    script:
        "../workflow_scripts/task_data.py"


rule task_baseline:
    # Gradient Ascent (qrerase.baselines.text), KGA or KU (qrerase.baselines.task) from the fine-tuned model.
    input:
        unpack(task_baseline_inputs),
    output:
        model=directory(path("baseline_model")),
        curve=path("baseline_curve"),
    log:
        log_path("task_baseline", "exp", "method"),
    benchmark:
        benchmark_path("task_baseline", "exp", "method")
    wildcard_constraints:
        exp=exp_pattern("task"),
        method="|".join(TASK_BASELINES),
    conda:
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "task_baseline",
            model=config["model"],
            cfg=lambda wc: TASK["baselines"][wc.method],
            max_length=lambda wc: exp_section("finetune", wc.exp).get(
                "max_length", 128
            ),
            seed=config["seed"],
        ),
    shell:
        launch("task_baseline.py")


rule task_evaluate:
    # Exact-match accuracy of greedy answers and answer-token NLL of one model on each role's eval set.
    input:
        unpack(task_checkpoint),
        **{f: path("data", name=f) for files in TASK_EVAL_FILES.values() for f in files},
    output:
        path("task_eval"),
    log:
        log_path("task_evaluate", "exp", "model"),
    wildcard_constraints:
        exp=exp_pattern("task"),
    conda:
        "../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=config["model"],
        evaluate=TASK.get("evaluate"),
        roles={r: list(f) for r, f in TASK_EVAL_FILES.items()},
        skills={r: TASK.get("data", {}).get(r) for r in TASK_ROLES},
        seed=config["seed"],
    script:
        "../workflow_scripts/task_evaluate.py"


rule task_table:
    # The paper's Table 1 layout: Method x {unrelated, similar, forgotten} accuracy; + NLL (wide).
    input:
        evals=[path("task_eval", exp=TASK_EXP, model=m) for m in task_models()],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption="../report/task_table.rst",
                category="Task-level",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("task", "task_wide")
            for ext in ("csv", "md", "tex")
        },
        metrics=path("task_metrics"),
    log:
        log_path("task_table"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        models=task_models(),
        skills={r: TASK.get("data", {}).get(r) for r in TASK_ROLES},
        rank=TASK_RANK,
        scale=TASK.get("scale"),
    script:
        "../workflow_scripts/task_table.py"
