# TOFU track: constants and input functions (its rules: rules.smk here; the shared chain in rules/core/).
from qrerase.tracks.tofu.data import holdout_split, required_splits
from qrerase.workflow.naming import format_exp

DATA_SETS = [
    "forget",
    "retain",
    "knowledge",
    "finetune_full",
    "finetune_retain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
    "pretrain",
    "tune_retain",
]


def tofu_data_files(wildcards):
    """The vendored files the data rule reads (so editing one re-runs everything downstream)."""
    data = config["tofu"]["data"]
    if data["source"] != "local":
        return []
    names = required_splits(data["split"], data.get("knowledge", []))
    return [str(Path(data["root"]) / f"{n}.jsonl") for n in names]


def tofu_holdout_file(wildcards):
    """The vendored files tofu_holdout reads, none for hub data (the holdout split, and the
    training splits none of its rows may be in, qrerase.tracks.tofu.data.make_holdout_set).
    """
    data = config["tofu"]["data"]
    if data["source"] != "local":
        return []
    split, knowledge = data["split"], data.get("knowledge", [])
    training = [n for n in required_splits(split, knowledge) if "perturbed" not in n]
    return [
        str(Path(data["root"]) / f"{n}.jsonl")
        for n in [holdout_split(split), *training]
    ]


# the TOFU experiment (tofu_<split>), its methods and its configured baselines
TOFU_METHODS = list(config["methods"]["tofu"])
TOFU_EXP = format_exp("tofu", config["tofu"]["data"]["split"])
# the experiments of its template tofu_<split> (not the size study's)
TOFU_EXPS = exp_pattern("tofu_<split>")
TOFU_BASELINES = [m for m in TOFU_METHODS if m in TEXT_BASELINES]


def eval_models():
    """Model names evaluated in the TOFU table: base, retain reference, each method (subspace
    methods at rank k: '<method>_k<rank>'; optimisation baselines by their name, e.g. 'npo').
    """
    return (
        ["base", "retain"]
        + [m if m in TEXT_BASELINES else format_model(m, RANK) for m in TOFU_METHODS]
        + [format_model(m, RANK) for m in CONTROLS]
    )


def imported_models():
    return {m["name"]: m for m in config["tofu"].get("imported_models", [])}


def metrics_inputs(wildcards):
    """A model's eval log and the retain reference's (none for the reference itself)."""
    local_ref = path("eval", exp=wildcards.exp, model="retain")
    item = imported_models().get(wildcards.model)
    if item is not None:
        return {"log": item["log"], "reference": item.get("reference") or local_ref}
    inputs = {"log": path("eval", exp=wildcards.exp, model=wildcards.model)}
    if wildcards.model != "retain":
        inputs["reference"] = local_ref
    return inputs


def metrics_name(wildcards):
    return row_key(wildcards.model)


def erase_targets():
    outs = []
    for method in [m for m in TOFU_METHODS if m in DECOMP]:
        if "adapter" in config["erase"]["outputs"]:
            outs.append(path("erase_adapter", exp=TOFU_EXP, rank=RANK, method=method))
        if "merged" in config["erase"]["outputs"]:
            outs.append(path("erased_model", exp=TOFU_EXP, rank=RANK, method=method))
    return outs


def tofu_targets():
    """The TOFU track's default targets: tables, figures, erase outputs, baseline curves, cost table."""
    return [
        *expand(PATHS["table"], table="tofu", ext=["csv", "md", "tex"]),
        *expand(PATHS["table"], table="tofu_wide", ext=["csv", "md", "tex"]),
        *expand(PATHS["table"], table="tofu_mia", ext=["csv", "md"]),
        path("figure", name="tofu_truth_ratio"),
        path("energy_fig", exp=TOFU_EXP),
        path("factor_report", exp=TOFU_EXP, rank=RANK),
        *erase_targets(),
        *[path("baseline_curve", exp=TOFU_EXP, method=m) for m in TOFU_BASELINES],
        *cost_targets("tofu"),
    ]


def tofu_costs():
    """The TOFU track's cost groups (rules/studies/cost_common.smk track_costs): one, its experiment."""
    given = config["lora"]["adapters"]
    return {
        "": cost_components(
            TOFU_EXP, TOFU_METHODS, RANK, TEXT_ERASE_RULE, adapters=given
        )
    }


def tofu_sweep():
    """(experiments, methods) of the TOFU trade-off sweep (rules/studies/tradeoff_common.smk): exp tofu_<split>."""
    return [TOFU_EXP], TOFU_METHODS


def tofu_tradeoff_targets():
    return text_tradeoff_targets("tofu")


def tofu_robustness():
    """The TOFU track's robustness plan (rules/studies/robustness.smk): its experiment's table models of
    robustness.methods.tofu with the fine-tuned model (ceiling) and the retain reference (floor);
    forget QA in blocks of 20 per author (TOFU's layout); utility: the retain evaluation set.
    """
    chosen = robustness_methods("tofu", TOFU_METHODS)
    return {
        "exps": [TOFU_EXP],
        "models": ["base", "retain"]
        + [m if m in TEXT_BASELINES else format_model(m, RANK) for m in chosen],
        "ceiling": "base",
        "floor": "retain",
        "weights": eval_model_inputs,
        "data": lambda exp: {
            "forget": path("data", exp=exp, name="forget"),
            "retain": path("data", exp=exp, name="retain"),
            "utility": path("data", exp=exp, name="eval_retain"),
            # the forget questions' paraphrases (TOFU's paraphrased_question): the paraphrase attack
            "paraphrases": path("data", exp=exp, name="eval_forget"),
        },
        "languages": lambda exp: [],
        "block": 20,
        "rank": RANK,
        "evaluate": {
            k: config["tofu"]["evaluate"][k] for k in ("batch_size", "max_length")
        },
        "statistic": "answer NLL",
        "prompts": True,  # the prompt attacks apply (a text model)
    }


# the functions the generic rules call for this track (qrerase.tracks.Track.bind)
def tofu_sweep_eval(wildcards):
    """A TOFU sweep point's evaluation (rules/studies/tradeoff_common.smk: sweep_eval): the TOFU eval sets (keys
    eval_<set>: a baseline point also reads the training sets forget / retain), the held-out retain
    slice and the retain reference's eval log; tofu.evaluate."""
    inputs = {
        **{f"eval_{s}": f for s, f in eval_data_inputs(wildcards).items()},
        "tune": path("data", exp=wildcards.exp, name="tune_retain"),
        "reference": path("eval", exp=wildcards.exp, model="retain"),
    }
    return inputs, config["tofu"]["evaluate"]


def text_runner_inputs():
    """The files of the text runner's inputs (Runner.inputs of this track), read by the shared baseline
    rules: 'refusals', the template answers of DPO and FLAT (tofu.baselines.refusals, else idontknow.txt
    next to the TOFU data)."""
    given = config["tofu"]["baselines"].get("refusals")
    return {
        "refusals": (
            given
            if given
            else str(Path(config["tofu"]["data"]["root"]) / "idontknow.txt")
        )
    }


registry.TRACKS["tofu"].bind(
    targets=tofu_targets,
    costs=tofu_costs,
    tradeoff_targets=tofu_tradeoff_targets,
    sweep=tofu_sweep,
    sweep_eval=tofu_sweep_eval,
    robustness=tofu_robustness,
    runner_inputs=text_runner_inputs,
)
