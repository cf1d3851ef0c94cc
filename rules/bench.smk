rule bench_decomposition:
    # Runtime of dense SVD / dense CPQR vs the exact factored paths, and whole-model erase time/RSS.
    output:
        csv=path("table", table="bench_decomposition", ext="csv"),
        plot=path("figure", name="bench_decomposition"),
        erase_csv=path("table", table="bench_erase", ext="csv"),
        table_csv=path("table", table="runtime", ext="csv"),
        table_md=path("table", table="runtime", ext="md"),
        table_tex=path("table", table="runtime", ext="tex"),
    params:
        sizes=config.get("bench", {}).get("sizes", [768, 2048, 4096, 8192]),
        lora_rank=config.get("bench", {}).get("lora_rank", 16),
        repeats=config.get("bench", {}).get("repeats", 3),
        max_dense_svd=config.get("bench", {}).get("max_dense_svd", 8192),
        model_shapes=config.get("bench", {}).get("model_shapes", ["llama3-8b", "llama3-70b"]),
        seed=config["seed"],
    log:
        log_path("bench_decomposition"),
    threads: config["threads"]
    resources:
        **resources_for("linalg"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/bench_decomposition.py"
