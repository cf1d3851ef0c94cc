# The generic LoRA task adapters (text experiments; speech: rule speech_lora).
def lora_base_inputs(wildcards):
    """The checkpoint the task adapters train from (`lora.base`): the fine-tuned model, or the
    pretrained one (the checkpoint built by rule pretrain; for a hub model, the hub checkpoint
    itself, which is no workflow file and is passed as a param instead)."""
    if config["lora"].get("base", "finetuned") == "finetuned":
        return {"model": base_model(wildcards)}
    if tiny_model():
        return {
            "model": path("model", exp=model_exp(wildcards.exp), which="pretrained")
        }
    return {}


rule lora:
    input:
        unpack(lora_base_inputs),
        data=path("data", name="{set}"),
    output:
        adapter=directory(path("lora")),
        curve=path("lora_curve"),
    log:
        log_path("lora", "exp", "set"),
    benchmark:
        benchmark_path("lora", "exp", "set")
    wildcard_constraints:
        exp=TEXT_EXPS,  # speech exps: rule speech_lora
    conda:
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        lora=lambda wc: exp_section("lora", wc.exp),
        seed=config["seed"],
    script:
        "../workflow_scripts/train_lora.py"
