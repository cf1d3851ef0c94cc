rule lora:
    input:
        model=path("model", which="full"),
        data=path("data", name="{set}"),
    output:
        adapter=directory(path("lora")),
        curve=path("lora_curve"),
    params:
        model=config["model"],
        lora=config["lora"],
        seed=config["seed"],
    log:
        log_path("lora", "exp", "set"),
    threads: config["threads"]
    resources:
        **resources_for("train"),
    conda:
        "../envs/qrerase.yaml"
    script:
        "../workflow_scripts/train_lora.py"
