rule bench_decomposition:
    # Runtime of dense SVD (gesdd) and dense CPQR (xGEQP3) vs the exact factored CPQR / SVD paths.
    output:
        csv="results/bench/decomposition.csv",
        plot="results/figures/bench_decomposition.png",
        table_csv="results/tables/runtime.csv",
        table_md="results/tables/runtime.md",
        table_tex="results/tables/runtime.tex",
    log:
        "results/logs/bench_decomposition/bench_decomposition.log",
    conda:
        "../envs/linalg.yaml"
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
        "../workflow_scripts/bench_decomposition.py"


rule bench_erase:
    # Whole-model erase (streaming, erase adapter out) with Llama-3-8B / 70B shapes: time and peak RSS.
    output:
        "results/bench/erase.csv",
    log:
        "results/logs/bench_erase/bench_erase.log",
    conda:
        "../envs/linalg.yaml"
    threads: config["threads"]
    resources:
        **resources_for("linalg"),
    params:
        model_shapes=config["bench"]["model_shapes"],
        lora_rank=config["bench"]["lora_rank"],
        seed=config["seed"],
    script:
        "../workflow_scripts/bench_erase.py"


rule bench:
    default_target: False
    # Both benchmarks: `snakemake bench --cores 2`.
    input:
        rules.bench_decomposition.output,
        rules.bench_erase.output,
