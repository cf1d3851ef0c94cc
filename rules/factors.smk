rule task_matrices:
    # T = (lora_alpha / r) B A per adapted module, kept factored.
    input:
        adapter=adapter_dir,
    output:
        path("task_matrix"),
    log:
        log_path("task_matrices", "exp", "set"),
    threads: 1
    resources:
        **resources_for("linalg"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/task_matrices.py"


rule factors:
    # Eqs. 1-2: rank-k column-pivoted QR (T Pi = Q R) or SVD of each task matrix, from its factors.
    input:
        path("task_matrix"),
    output:
        path("factors"),
    params:
        rank=lambda wc: int(wc.rank),
    log:
        log_path("factors", "exp", "rank", "decomp", "set"),
    threads: 1
    resources:
        **resources_for("linalg"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/factors.py"


rule factor_report:
    # Per module: energy, rank-k reconstruction errors, max sin(Theta) CPQR vs SVD, eq. 10 bound.
    input:
        forget=path("task_matrix", set="forget"),
        retain=path("task_matrix", set="retain"),
    output:
        path("factor_report"),
    params:
        rank=lambda wc: int(wc.rank),
        retain_rank=config["unlearn"]["retain_rank"],
        granularity=config["unlearn"]["energy_granularity"],
    log:
        log_path("factor_report", "exp", "rank"),
    threads: 1
    resources:
        **resources_for("linalg"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/factor_report.py"


rule forget_update:
    # Eqs. 3-5: Q~_f = (I - P_r) Q_f,k and T~_f = Q~_f R_f,k Pi^T, stored as low-rank factors.
    input:
        forget=path("factors", set="forget"),
        retain=path("factors", set="retain"),
    output:
        path("update"),
    params:
        retain_rank=config["unlearn"]["retain_rank"],
        scale=config["unlearn"]["scale"],
    log:
        log_path("forget_update", "exp", "rank", "decomp"),
    threads: 1
    resources:
        **resources_for("linalg"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/forget_update.py"
