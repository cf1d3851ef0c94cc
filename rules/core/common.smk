# The shared stages' input functions and config lookups: the text chain every text track runs
# (data -> model -> LoRA -> task matrices -> factors -> energy -> erase -> evaluate). Included by the
# Snakefile right after rules/common.smk (whose globals, path() and resources it uses).


def tiny_model():
    return config["model"]["name_or_path"] is None


# A GGUF model (model.name_or_path / model.gguf_file): the file, found at planning time from package
# metadata (qrerase.models.gguf; no torch), which rule import_gguf turns into the pretrained checkpoint.
GGUF_FILE = resolve_gguf(config["model"])


def imported_model(exp):
    """The imported GGUF checkpoint of an experiment's model family (rule import_gguf), or None."""
    return path("imported", exp=model_exp(exp)) if GGUF_FILE else None


def base_model(wildcards):
    """The fine-tuned ("full") model an experiment's erase edits (and baselines) start from."""
    return path("model", exp=model_exp(wildcards.exp), which="full")


def exp_section(section, exp):
    """A training config section for an experiment: 'pretrain', 'finetune', 'lora' or 'tokenizer'
    (model.tokenizer), with its track's overrides (crosslingual.<section>, task_level.<section>;
    qrerase.workflow.stages.track_section) and the size study's lr law."""
    base = track_section(config, parse_exp(exp).track, section)
    if size_of(exp) is not None and "lr" in base:  # the size study's lr law
        base["lr"] = size_lr(base["lr"], exp)
    return base


def stage_params(stage, exp):
    """The recipe of a training job of `stage` (a baseline's name) in experiment `exp`, as the memory
    plan reads it (qrerase.workflow.stages.stage_recipe), with the size study's lr law.
    """
    section = stage_recipe(config, parse_exp(exp).track, stage)
    if size_of(exp) is not None and "lr" in section:  # the size study's lr law
        section["lr"] = size_lr(section["lr"], exp)
    return section


def engine_params(stage, exp):
    """The `engine` param of a training rule: the engine settings the memory plan planned the job of
    `stage` ('pretrain', 'finetune', 'lora' or a baseline's name) with (backend,
    gradient_checkpointing, micro_batch_size; qrerase.workflow.stages.engine_settings), which
    the script lays over its recipe param, so the job runs what `qrerase plan` shows."""
    return engine_settings(config, parse_exp(exp).track, stage)


def finetune_adapter(exp):
    """The LoRA shape of `finetune.mode: lora` (finetune.lora, else the `lora` section's r, alpha,
    dropout, target_modules); None for a full fine-tune."""
    section = exp_section("finetune", exp)
    if section.get("mode", "full") != "lora":
        return None
    keys = ("r", "alpha", "dropout", "target_modules")
    shape = section.get("lora") or {
        k: v for k, v in config["lora"].items() if k in keys
    }
    return {"dropout": 0.0, **shape}


def erase_scale(exp):
    """lambda of W' = W - lambda T~_f for an experiment: its track's (qrerase.tracks.Track.erase_scale:
    `unlearn.scale`, `speech.scale` for speech, `task_level.scale` if set for the task-level track).
    """
    return track_of_exp(exp).erase_scale(config)


def tokenizer_texts(wildcards):
    """The text the embedded model's tokenizer is trained on: the fine-tuning set, every evaluation
    set and the pretraining text (the task-level track's pretraining set is part of its fine-tuning
    set, so it adds nothing there: qrerase.tracks.Track.pretrain_text)."""
    names = ["finetune_full", *(f"eval_{s}" for s in EVAL_SETS)]
    if track_of_exp(wildcards.exp).pretrain_text:
        names.append("pretrain")
    return [path("data", exp=wildcards.exp, name=n) for n in names]


def finetune_init_inputs(wildcards):
    """What fine-tuning starts from: the tokenizer to build the model on (rule pretrain), the
    pretrained checkpoint (both fine-tuned models of the embedded default), or nothing (a hub
    model, loaded by name)."""
    if not tiny_model():
        return {"init": imported_model(wildcards.exp)} if GGUF_FILE else {}
    pretraining = wildcards.get("which", "pretrained") == "pretrained"
    # a track with its own start (its bound finetune_start, qrerase.tracks.Track.bind), e.g. task_level
    start = track_of_exp(wildcards.exp).function("finetune_start")
    if start is not None and not pretraining:
        return start(wildcards)
    if pretraining:
        return {"tokenizer": path("tokenizer", exp=wildcards.exp)}
    return {"init": path("model", exp=wildcards.exp, which="pretrained")}


def lora_base_inputs(wildcards):
    """The checkpoint the task adapters train from (`lora.base`; the task-level track's
    `task_level.lora.base` overrides it): the fine-tuned model, or the
    pretrained one (the checkpoint built by rule pretrain; for a hub model, the hub checkpoint
    itself, which is no workflow file and is passed as a param instead)."""
    if exp_section("lora", wildcards.exp).get("base", "finetuned") == "finetuned":
        return {"model": base_model(wildcards)}
    if tiny_model():
        return {
            "model": path("model", exp=model_exp(wildcards.exp), which="pretrained")
        }
    if GGUF_FILE:
        return {"model": imported_model(wildcards.exp)}
    return {}


def adapter_dir(wildcards):
    """A user's existing adapter for this set, or the one the lora rule trains."""
    return adapter_dir_of(wildcards.exp, wildcards.set)


def adapter_dir_of(exp, which):
    given = config["lora"]["adapters"].get(which)
    return given if given else path("lora", exp=exp, set=which)


def retain_factors(wildcards, which):
    """The factors P_r is built from (eq. 3): rank max(k, unlearn.retain_rank), so that a retain rank
    above k uses the leading columns of a decomposition that has them (truncation is exact).
    """
    rank = max(int(wildcards.rank), config["unlearn"].get("retain_rank") or 0)
    return path(
        "factors", exp=wildcards.exp, rank=rank, decomp=wildcards.decomp, set=which
    )


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


def diagnostic_inputs(exp, model, plan):
    """The subspace diagnostic's inputs of a robustness job (rules/studies/robustness.smk): the forget (`task`) and
    retain (`retain_task`, the control) task matrices' SVD factors at the plan's rank; a subspace method's own
    erase update (`tilde`, `selected`); for the ceiling, every subspace model's of the plan (`span:<model>:...`:
    where the fine-tuned model's own relearning update falls in each method's span(Q~_f)).
    """
    from types import SimpleNamespace

    rank = plan["rank"]
    inputs = {
        "task": path("factors", exp=exp, rank=rank, decomp="svd", set="forget"),
        "retain_task": path("factors", exp=exp, rank=rank, decomp="svd", set="retain"),
    }
    method, k = split_model(model)
    if k is not None:
        inputs.update(erase_inputs(SimpleNamespace(exp=exp, rank=k, method=method)))
    if model == plan["ceiling"]:
        for other in plan["models"]:
            method, k = split_model(other)
            if k is not None:
                spans = erase_inputs(SimpleNamespace(exp=exp, rank=k, method=method))
                inputs.update({f"span:{other}:{key}": f for key, f in spans.items()})
    return inputs


def split_model(model):
    """'qr_erase_k4' -> ('qr_erase', '4') for a subspace method (naming.parse_model); any other model
    name -> (name, None)."""
    method, rank = parse_model(model)
    known = rank is not None and method.removesuffix(CONTROL) in DECOMP
    return (method, str(rank)) if known else (model, None)


def row_key(model):
    """The table's row key of a model: its method (rank dropped), base, retain or imported name."""
    return split_model(model)[0]


def eval_model_inputs(wildcards):
    """Where the evaluated model's weights come from: a checkpoint (base, retain, a baseline's, a
    merged erase), or base + erase adapter."""
    model = wildcards.model
    if model in ("base", "retain"):
        which = "full" if model == "base" else "retain"
        return {"model": path("model", exp=model_exp(wildcards.exp), which=which)}
    if model in TEXT_BASELINES:
        return {"model": path("baseline_model", exp=wildcards.exp, method=model)}
    method, rank = split_model(model)
    if rank is None:
        raise WorkflowError(f"evaluate: unknown model '{model}'")
    if "merged" in config["erase"]["outputs"]:
        return {
            "model": path("erased_model", exp=wildcards.exp, rank=rank, method=method)
        }
    return {
        "model": base_model(wildcards),
        "adapter": path("erase_adapter", exp=wildcards.exp, rank=rank, method=method),
    }


def eval_data_inputs(wildcards):
    return {s: path("data", exp=wildcards.exp, name=f"eval_{s}") for s in EVAL_SETS}


# the shared text baseline rule's inputs (rules/core/baselines.smk)
def baseline_inputs(wildcards):
    """The fine-tuned model of the experiment's model family, its forget/retain sets (any exp), and the
    runner inputs the method reads (registry.Method.inputs: the files the track bringing the experiment's
    runner binds as `runner_inputs`; the text runner's 'refusals')."""
    inputs = {
        "model": base_model(wildcards),
        "forget": path("data", exp=wildcards.exp, name="forget"),
        "retain": path("data", exp=wildcards.exp, name="retain"),
    }
    if wanted := registry.method(wildcards.method).inputs:
        runner = registry.TRACKS[parse_exp(wildcards.exp).track].runner
        files = registry.TRACKS[registry.runner_track(runner)].function(
            "runner_inputs"
        )()
        inputs.update({name: files[name] for name in wanted})
    return inputs


def baseline_params(wildcards):
    """qrerase.baselines.text.TextBaselineConfig fields of one method (stage_params: tofu.baselines.<method>
    and the mode, max_length and LoRA shape of `tofu.baselines`); the engine settings come as the rule's
    `engine` param, seed and threads from the job."""
    return stage_params(wildcards.method, wildcards.exp)
