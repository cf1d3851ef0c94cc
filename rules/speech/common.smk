# Speech track: constants and input functions (its rules: rules/speech/rules.smk, which includes this file).
from qrerase.workflow.naming import format_exp

SPEECH_EXPS = exp_pattern("speech_<setting>")
SPEECH_BASELINES = registry.baselines_for("speech")
SPEECH_SETTINGS = list(config["speech"]["settings"])
SPEECH_RANK_SETTINGS = list(config["speech"]["rank_settings"])
SPEECH_RANK = config["speech"]["rank"]
SPEECH_RANKS = sorted(set(config["speech"]["ranks"]))
SPEECH_METHODS = list(config["methods"].get("speech", []))
SPEECH_TRADEOFF = config["speech"]["tradeoff"]
# the sweep runs on the settings the track runs (speech.settings) that speech.tradeoff.settings names
SPEECH_TRADEOFF_SETTINGS = [
    s for s in SPEECH_TRADEOFF["settings"] if s in SPEECH_SETTINGS
]


def speech_exp(setting=None):
    """'sample' -> 'speech_sample'; None -> the shared 'speech' experiment."""
    return format_exp("speech", setting)


def speech_setting(wildcards):
    """'speech_sample' -> 'sample'."""
    return parse_exp(wildcards.exp).arg


def speech_data_params():
    sp = config["speech"]
    return {
        **sp["data"],
        "test_fraction": sp["test_fraction"],
        "val_fraction": sp.get("val_fraction", 0.0),
        "forget_fraction": sp["forget_fraction"],
        "forget_speakers": sp.get("forget_speakers"),
    }


def speech_wavs(wildcards):
    """The recordings the data rule reads (editing one re-runs everything downstream)."""
    from qrerase.tracks.speech.data import list_recordings

    data = config["speech"]["data"]
    try:
        recs = list_recordings(data["root"], data.get("max_per_digit"))
    except (FileNotFoundError, ValueError) as exc:
        raise WorkflowError(f"config key 'speech.data.root': {exc}") from None
    return [r.path for r in recs]


def speech_data_inputs():
    """The prepared arrays, index and metadata (always those of exp 'speech')."""
    return {
        key: path(f"speech_{key}", exp=speech_exp())
        for key in ("audio", "index", "meta")
    }


def speech_tiny():
    """True for the embedded tiny HuBERT (pretrained here); False for a hub checkpoint (the pretrained model)."""
    return config["speech"]["model"]["name_or_path"] is None


def speech_pretrained_inputs(wildcards=None):
    """The digit-pretrained checkpoint fine-tuning starts from (none for a hub model: the hub checkpoint)."""
    return (
        {"pretrained": path("speech_pretrained", exp=speech_exp())}
        if speech_tiny()
        else {}
    )


def speech_lora_inputs(wildcards):
    """The fine-tuned model and, for speech.lora.base 'pretrained', the encoder the adapters train on."""
    inputs = {"model": base_model(wildcards)}
    if config["speech"]["lora"].get("base", "finetuned") == "pretrained":
        inputs.update(speech_pretrained_inputs(wildcards))
    return inputs


def speech_baseline_params(wildcards):
    """`speech.baselines.common` overlaid by `speech.baselines.<method>` (stage_params)."""
    return stage_params(wildcards.method, wildcards.exp)


def speech_models():
    """Model names evaluated in the speech table: base, then each method (subspace ones at rank k)."""
    return ["base"] + [
        format_model(m, SPEECH_RANK) if m in DECOMP else m for m in SPEECH_METHODS
    ]


def speech_checkpoint(wildcards):
    """Model name -> checkpoint: base, '<method>_k<rank>' (merged erase) or a baseline."""
    model = wildcards.model
    if model == "base":
        return base_model(wildcards)
    if model in SPEECH_BASELINES:
        return path("speech_baseline", exp=wildcards.exp, method=model)
    method, rank = split_model(model)
    if rank is None:
        raise WorkflowError(f"speech_evaluate: unknown model '{model}'")
    return path("erased_model", exp=wildcards.exp, rank=rank, method=method)


def speech_targets():
    outs = [
        *expand(PATHS["table"], table="speech", ext=["csv", "md", "tex"]),
        *expand(PATHS["table"], table="speech_mia", ext=["csv", "md"]),
        path("figure", name="speech_energy"),
        *expand(PATHS["table"], table="speech_energy", ext=["csv", "md"]),
        *[path("energy_fig", exp=speech_exp(s)) for s in SPEECH_SETTINGS],
    ]
    if SPEECH_RANK_SETTINGS:
        outs += [
            path("figure", name="speech_rank"),
            path("table", table="speech_rank", ext="csv"),
        ]
    return [*outs, *cost_targets("speech")]


def speech_tradeoff_methods():
    """Methods of the trade-off sweep: the subspace ones of methods.speech, then its baselines that
    have a knob under speech.tradeoff.baselines."""
    sweeps = SPEECH_TRADEOFF["baselines"]
    return [m for m in SPEECH_METHODS if m in DECOMP] + [
        m for m in SPEECH_METHODS if m in SPEECH_BASELINES and m in sweeps
    ]


def speech_tradeoff_factor_inputs(wildcards):
    """The lambda-free factors of both sets at every swept rank (and the LL selection)."""
    inputs = {
        f"{s}_k{k}": path(
            "factors",
            exp=wildcards.exp,
            rank=k,
            decomp=DECOMP[wildcards.method],
            set=s,
        )
        for k in sorted(SPEECH_TRADEOFF["ranks"])
        for s in ("forget", "retain")
    }
    if registry.is_localised(wildcards.method):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


def speech_tradeoff_targets():
    """The speech trade-off sweep's outputs (not part of the default target; `snakemake speech_tradeoff_all`)."""
    return [
        path("table", table="speech_tradeoff", ext="csv"),
        path("table", table="speech_scale_rule", ext="csv"),
        path("figure", name="speech_tradeoff"),
    ]


def speech_tradeoff_baseline_inputs(wildcards):
    """A baseline's workflow-trained model (re-used at its configured knob value); none for 'base'."""
    if wildcards.method == "base":
        return {}
    return {
        "trained": path("speech_baseline", exp=wildcards.exp, method=wildcards.method)
    }


def speech_tradeoff_sweep(wildcards):
    """(knob, values) of a baseline's sweep; ('', []) for the fine-tuned reference point."""
    if wildcards.method == "base":
        return {"param": "", "values": []}
    sweep = SPEECH_TRADEOFF["baselines"][wildcards.method]
    return {"param": sweep["param"], "values": list(sweep["values"])}


def speech_costs():
    """The speech track's cost groups: one per setting."""
    return {
        s: cost_components(
            speech_exp(s),
            SPEECH_METHODS,
            SPEECH_RANK,
            "erase_merged",
            lora_rule="speech_lora",
            baseline_rule="speech_baseline",
        )
        for s in SPEECH_SETTINGS
    }


def speech_robustness():
    """The speech track's robustness plan (rules/studies/robustness.smk): per setting, the fine-tuned classifier
    (ceiling), the retain reference (floor: the same recipe on D_r only, trained in its attack job by
    qrerase.tracks.speech.robustness.retain_reference) and the table models of robustness.methods.speech. The
    statistic is top-1 speaker accuracy; B is half of D_f (split by speaker in the class setting).
    """
    chosen = robustness_methods("speech", SPEECH_METHODS)

    def weights(wildcards):
        # the floor is trained in its job, from the encoder fine-tuning starts from
        if wildcards.model == "retain":
            return speech_pretrained_inputs()
        return {"model": speech_checkpoint(wildcards)}

    return {
        "exps": [speech_exp(s) for s in SPEECH_SETTINGS],
        "models": ["base", "retain"]
        + [format_model(m, SPEECH_RANK) if m in DECOMP else m for m in chosen],
        "ceiling": "base",
        "floor": "retain",
        "weights": weights,
        "data": lambda exp: speech_data_inputs(),
        "languages": lambda exp: [],
        "block": None,
        "rank": SPEECH_RANK,
        "evaluate": {
            "batch_size": config["speech"]["evaluate"]["batch_size"],
            "top_k": 1,
        },
        "statistic": "accuracy",
    }


def speech_robustness_inputs(wildcards):
    """Rule robustness_speech's inputs: the attacked classifier (the retain reference: what it is trained
    from), the ceiling, the prepared data and the subspace diagnostic's (diagnostic_inputs: the task
    matrices' factors, the erase updates)."""
    from types import SimpleNamespace

    plan = speech_robustness()
    inputs = {**plan["data"](wildcards.exp), **plan["weights"](wildcards)}
    ceiling = SimpleNamespace(exp=wildcards.exp, model=plan["ceiling"])
    inputs["ceiling"] = plan["weights"](ceiling)["model"]
    inputs.update(diagnostic_inputs(wildcards.exp, wildcards.model, plan))
    return inputs


def speech_robustness_params(wildcards):
    """Rule robustness_speech's settings: the setting, the training rates (full: speech.finetune, lora:
    speech.lora), the LoRA shape, the evaluation, and for the floor the fine-tuning recipe.
    """
    sp = config["speech"]
    plan = speech_robustness()
    job = {
        "setting": speech_setting(wildcards),
        "rates": {
            "full": [sp["finetune"]["lr"], sp["finetune"]["batch_size"]],
            "lora": [sp["lora"]["lr"], sp["lora"]["batch_size"]],
        },
        "lora_shape": {
            "r": sp["lora"]["r"],
            "alpha": sp["lora"]["alpha"],
            "dropout": sp["lora"].get("dropout", 0.0),
            "target_modules": sp["lora"]["target_modules"],
        },
        "evaluate": plan["evaluate"],
        "rank": plan["rank"],
    }
    if wildcards.model == plan["floor"]:  # rule speech_finetune's recipe
        job["reference"] = {
            **sp["finetune"],
            **engine_params("finetune", speech_exp()),
        }
    return job


# the functions the generic rules call for this track (qrerase.tracks.Track.bind)
registry.TRACKS["speech"].bind(
    targets=speech_targets,
    costs=speech_costs,
    tradeoff_targets=speech_tradeoff_targets,
    robustness=speech_robustness,
)
