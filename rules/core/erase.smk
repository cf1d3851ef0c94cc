rule erase_adapter:
    # Eq. 6 / 16 as a rank-k PEFT LoRA adapter (B = -lambda Q~_f-side, A = R Pi^T-side).
    input:
        unpack(erase_inputs),
        model=base_model,
        forget_adapter=forget_adapter_dir,
    output:
        directory(path("erase_adapter")),
    log:
        log_path("erase_adapter", "exp", "rank", "method"),
    benchmark:
        benchmark_path("erase_adapter", "exp", "rank", "method")
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../../workflow_scripts/core/erase_adapter.py"


rule erase_merged:
    # Eq. 6 / 16 merged: W' = W - lambda T~_f on every (or only the selected) layer(s), streamed shard
    # by shard on the CPU (a linalg job: no GPU).
    input:
        unpack(erase_inputs),
        model=base_model,
    output:
        directory(path("erased_model")),
    log:
        log_path("erase_merged", "exp", "rank", "method"),
    benchmark:
        benchmark_path("erase_merged", "exp", "rank", "method")
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("linalg"),
    script:
        "../../workflow_scripts/core/erase_merged.py"
