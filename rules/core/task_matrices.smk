rule task_matrices:
    # T = (lora_alpha / r) B A per adapted module, kept factored.
    input:
        adapter=adapter_dir,
        model=base_model,
    output:
        path("task_matrix"),
    log:
        log_path("task_matrices", "exp", "set"),
    benchmark:
        benchmark_path("task_matrices", "exp", "set")
    conda:
        "../../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("linalg"),
    script:
        "../../workflow_scripts/core/task_matrices.py"


rule factors:
    # Eqs. 1-2: rank-k column-pivoted QR (T Pi = Q R) or SVD of each task matrix, from its factors.
    input:
        path("task_matrix"),
    output:
        path("factors"),
    log:
        log_path("factors", "exp", "rank", "decomp", "set"),
    benchmark:
        benchmark_path("factors", "exp", "rank", "decomp", "set")
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("linalg"),
    params:
        rank=lambda wc: int(wc.rank),
    script:
        "../../workflow_scripts/core/factors.py"


rule factor_report:
    # Per module: energy, rank-k reconstruction errors, max sin(Theta) CPQR vs SVD, eq. 10 bound.
    input:
        forget=path("task_matrix", set="forget"),
        retain=path("task_matrix", set="retain"),
        # eq. 16's selection as the energy rule wrote it (one reader: qrerase.method.energy.read_selection)
        selection=path("selected"),
    output:
        path("factor_report"),
    log:
        log_path("factor_report", "exp", "rank"),
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("linalg"),
    params:
        rank=lambda wc: int(wc.rank),
        retain_rank=config["unlearn"]["retain_rank"],
        granularity=config["unlearn"]["energy_granularity"],
        # named in the error when the two adapters adapt different modules
        adapters=lambda wc: [adapter_dir_of(wc.exp, s) for s in ("forget", "retain")],
    script:
        "../../workflow_scripts/core/factor_report.py"


rule forget_update:
    # Eqs. 3-5: Q~_f = (I - P_r) Q_f,k and T~_f = Q~_f R_f,k Pi^T, stored as low-rank factors.
    input:
        forget=path("factors", set="forget"),
        retain=lambda wc: retain_factors(wc, "retain"),
    output:
        path("update"),
    log:
        log_path("forget_update", "exp", "rank", "decomp"),
    benchmark:
        benchmark_path("forget_update", "exp", "rank", "decomp")
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("linalg"),
    params:
        retain_rank=config["unlearn"]["retain_rank"],
        scale=lambda wc: erase_scale(wc.exp),
    script:
        "../../workflow_scripts/core/forget_update.py"


rule forget_update_control:
    # The selectivity control: eqs. 3-5 with the adapters' roles swapped (T_f := T_r, P_r from T_f).
    input:
        forget=path("factors", set="retain"),
        retain=lambda wc: retain_factors(wc, "forget"),
    output:
        path("update_control"),
    log:
        log_path("forget_update_control", "exp", "rank", "decomp"),
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("linalg"),
    params:
        retain_rank=config["unlearn"]["retain_rank"],
        scale=lambda wc: erase_scale(wc.exp),
    script:
        "../../workflow_scripts/core/forget_update.py"
