rule baseline:
    # Optimisation baselines (GA, GradDiff, KL, NPO, DPO, FLAT): unlearn by training the fine-tuned model.
    input:
        unpack(baseline_inputs),
    output:
        model=directory(path("baseline_model")),
        curve=path("baseline_curve"),
    log:
        log_path("baseline", "exp", "method"),
    benchmark:
        benchmark_path("baseline", "exp", "method")
    wildcard_constraints:
        exp=r"tofu_forget\d\d|xling_[a-z]{2}(_R)?",
        method="|".join(BASELINES),
    conda:
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        baseline=baseline_params,
        seed=config["seed"],
    script:
        "../workflow_scripts/baseline.py"


rule tofu_cost:
    # Companion of the TOFU table: wall time of each method's jobs (baseline training vs LoRA +
    # closed-form erase), from Snakemake's benchmark files. Timings differ between runs.
    input:
        [
            f
            for parts in cost_components(EXP).values()
            for fs in parts.values()
            for f in fs
        ],
    output:
        csv=path("table", table="tofu_cost", ext="csv"),
        md=path("table", table="tofu_cost", ext="md"),
    log:
        log_path("tofu_cost"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        components=cost_components(EXP),
    script:
        "../workflow_scripts/tofu_cost.py"
