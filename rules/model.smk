# The generic model rules (every text experiment): tokenizer, pretrained and fine-tuned models.
def tokenizer_texts(wildcards):
    """The text the embedded model's tokenizer is trained on: the fine-tuning set, every evaluation
    set and the pretraining text (the task-level track has no pretraining set yet)."""
    names = ["finetune_full", *(f"eval_{s}" for s in EVAL_SETS)]
    if wildcards.exp != TASK_EXP:
        names.append("pretrain")
    return [path("data", exp=wildcards.exp, name=n) for n in names]


def finetune_init_inputs(wildcards):
    """What fine-tuning starts from: the tokenizer to build the model on (rule pretrain), the
    pretrained checkpoint (both fine-tuned models of the embedded default), or nothing (a hub
    model, loaded by name)."""
    if not tiny_model():
        return {}
    if wildcards.exp == TASK_EXP:  # the task-level track (rules/task.smk)
        return task_start_inputs(wildcards)
    if wildcards.get("which", "pretrained") == "pretrained":
        return {"tokenizer": path("tokenizer", exp=wildcards.exp)}
    return {"init": path("model", exp=wildcards.exp, which="pretrained")}


rule tokenizer:
    input:
        tokenizer_texts,
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
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        train=lambda wc: exp_section("pretrain", wc.exp),
        seed=config["seed"],
    script:
        "../workflow_scripts/finetune.py"


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
    wildcard_constraints:
        exp=TEXT_EXPS,  # speech exps: rule speech_finetune
        which="full|retain",
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
