# The erase edit (eq. 6 / 16), as an adapter or merged, shared by every track.
def forget_adapter_dir(wildcards):
    """The experiment's forget adapter (its fan_in_fan_out, set for Conv1D models, carries over)."""
    given = config["lora"]["adapters"].get("forget")
    return given if given else path("lora", exp=wildcards.exp, set="forget")


def erase_inputs(wildcards):
    key = "update_control" if wildcards.method.endswith(CONTROL) else "update"
    decomp = method_decomp(wildcards.method)
    inputs = {"tilde": path(key, exp=wildcards.exp, rank=wildcards.rank, decomp=decomp)}
    if registry.is_localised(wildcards.method):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


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
        "../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../workflow_scripts/erase_adapter.py"


rule erase_merged:
    # Eq. 6 / 16 merged: W' = W - lambda T~_f on every (or only the selected) layer(s).
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
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        kind=lambda wc: model_kind(wc.exp),
    script:
        "../workflow_scripts/erase_merged.py"
