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
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "lora",
            model=lambda wc: exp_model(wc.exp),
            lora=lambda wc: exp_section("lora", wc.exp),
            engine=lambda wc: engine_params("lora", wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
        ),
    shell:
        launch("core/train_lora.py")
