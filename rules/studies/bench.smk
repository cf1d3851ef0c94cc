rule bench_decomposition:
    # Runtime of dense SVD (gesdd) and dense CPQR (xGEQP3) vs the exact factored CPQR / SVD paths.
    output:
        csv=path("bench", name="decomposition"),
        plot=path("figure", name="bench_decomposition"),
        table_csv=path("table", table="runtime", ext="csv"),
        table_md=path("table", table="runtime", ext="md"),
        table_tex=path("table", table="runtime", ext="tex"),
    log:
        log_path("bench_decomposition"),
    conda:
        "../../envs/linalg.yaml"
    threads: config["threads"]
    resources:
        **resources_for("linalg"),
    params:
        sizes=config["bench"]["sizes"],
        lora_rank=config["bench"]["lora_rank"],
        repeats=config["bench"]["repeats"],
        max_dense_svd=config["bench"]["max_dense_svd"],
        seed=config["seed"],
    script:
        "../../workflow_scripts/studies/bench_decomposition.py"


rule bench_erase:
    # Whole-model erase (streaming, erase adapter out) with Llama-3-8B / 70B shapes: time and peak RSS.
    output:
        path("bench", name="erase"),
    log:
        log_path("bench_erase"),
    conda:
        "../../envs/linalg.yaml"
    threads: config["threads"]
    resources:
        **resources_for("linalg"),
    params:
        model_shapes=config["bench"]["model_shapes"],
        lora_rank=config["bench"]["lora_rank"],
        seed=config["seed"],
    script:
        "../../workflow_scripts/studies/bench_erase.py"


rule bench:
    default_target: False
    # Both benchmarks: `snakemake bench --cores 2`.
    input:
        rules.bench_decomposition.output,
        rules.bench_erase.output,
