rule tokenizer:
    input:
        path("data", name="finetune_full"),
        path("data", name="eval_forget"),
        path("data", name="eval_retain"),
        path("data", name="eval_real_authors"),
        path("data", name="eval_world_facts"),
    output:
        directory(path("tokenizer")),
    log:
        log_path("tokenizer", "exp"),
    conda:
        "../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        vocab_size=lambda wc: exp_section("tokenizer", wc.exp)["vocab_size"],
        individual_digits=lambda wc: exp_section("tokenizer", wc.exp).get(
            "individual_digits", False
        ),
    script:
        "../workflow_scripts/train_tokenizer.py"


rule finetune:
    input:
        unpack(base_model_inputs),
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
    wildcard_constraints:
        exp=r"(?!speech)\w+",  # speech exps: rule speech_finetune
    conda:
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        train=lambda wc: exp_section("finetune", wc.exp),
        seed=config["seed"],
    script:
        "../workflow_scripts/finetune.py"
