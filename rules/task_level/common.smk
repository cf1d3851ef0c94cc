# Task-level track: constants and input functions (its rules: rules/task_level/rules.smk, which includes this file).
from qrerase.tracks.task_level.data import EVAL_FILES as TASK_LEVEL_EVAL_FILES
from qrerase.tracks.task_level.data import ROLES as TASK_LEVEL_ROLES

TASK_LEVEL = config.get("task_level", {})
TASK_LEVEL_EXP = registry.TRACKS["task_level"].prefix  # its one experiment
TASK_LEVEL_METHODS = list(config["methods"].get("task_level", []))
TASK_LEVEL_BASELINES = registry.baselines_for("task_level")
TASK_LEVEL_RANK = TASK_LEVEL.get("rank", RANK)
TASK_LEVEL_TRADEOFF = TASK_LEVEL.get("tradeoff") or {}
TASK_LEVEL_DATA_SETS = [
    "forget",
    "retain",
    "new",
    "finetune_full",
    "pretrain",
    "tune_retain",
    *(f for files in TASK_LEVEL_EVAL_FILES.values() for f in files),
]


def task_level_init_model(wildcards):
    """The checkpoint the task model is fine-tuned from (and KGA's auxiliary models start from).

    `task_level.init: pretrained` (the embedded model): the checkpoint of rule pretrain, trained on
    the retained skills but not the forgotten one (data set `pretrain`); `scratch`, or a hub model
    (model.name_or_path, itself the pretrained model): {} (a new tiny model, or the hub checkpoint).
    """
    if tiny_model() and TASK_LEVEL.get("init", "pretrained") == "pretrained":
        return {"init": path("model", exp=wildcards.exp, which="pretrained")}
    return {}


def task_level_start_inputs(wildcards):
    """What the task model starts from: task_level_init_model's checkpoint, else a new tiny model on the
    run's tokenizer (nothing for a hub model, loaded by name)."""
    init = task_level_init_model(wildcards)
    if init or not tiny_model():
        return init
    return {"tokenizer": path("tokenizer", exp=wildcards.exp)}


def task_level_data_files(wildcards):
    """The vendored knowledge files the generator reads (an edit re-runs everything downstream)."""
    data = TASK_LEVEL.get("data", {})
    if "knowledge" not in [data.get(r) for r in TASK_LEVEL_ROLES]:
        return []
    know = data.get("knowledge", {})
    root = Path(know.get("root", "data/tofu"))
    return [
        str(root / f"{s}.jsonl")
        for s in know.get("sources", ["world_facts", "real_authors"])
    ]


def task_level_models():
    """Evaluated models: base, then each method (subspace methods at rank k: '<method>_k<rank>')."""
    return ["base"] + [
        format_model(m, TASK_LEVEL_RANK) if m in DECOMP else m
        for m in TASK_LEVEL_METHODS
    ]


def task_level_checkpoint(wildcards):
    """Model name -> weights: base, a baseline's checkpoint, a merged erase, or base + erase adapter."""
    model = wildcards.model
    if model == "base":
        return {"model": base_model(wildcards)}
    if model in TASK_LEVEL_BASELINES:
        return {"model": path("baseline_model", exp=wildcards.exp, method=model)}
    if split_model(model)[1] is None:
        raise WorkflowError(f"task_level_evaluate: unknown model '{model}'")
    return eval_model_inputs(wildcards)


def task_level_baseline_inputs(wildcards):
    inputs = {
        "model": base_model(wildcards),
        **{
            s: path("data", exp=wildcards.exp, name=s)
            for s in ("forget", "retain", "new")
        },
    }
    # KGA's A_f and A_n start from the fine-tuning's initial checkpoint (the 'initial' input)
    if "initial" in registry.method(wildcards.method).inputs:
        inputs.update(task_level_start_inputs(wildcards))
    return inputs


def task_level_targets():
    return [
        *expand(
            PATHS["table"],
            table=["task_level", "task_level_wide"],
            ext=["csv", "md", "tex"],
        ),
        path("task_level_metrics"),
        path("energy_fig", exp=TASK_LEVEL_EXP),
        path("factor_report", exp=TASK_LEVEL_EXP, rank=TASK_LEVEL_RANK),
        *cost_targets("task_level"),
    ]


def task_level_tradeoff_inputs(wildcards):
    """The lambda-free factors of both sets at every swept rank (retain at max(k, retain_rank)) and,
    for a layer-localised method, the LL selection."""
    decomp = DECOMP[wildcards.method]
    inputs = {}
    retain_rank = config["unlearn"].get("retain_rank") or 0
    for k in TASK_LEVEL_TRADEOFF.get("ranks", []):
        for s, rank in (("forget", k), ("retain", max(k, retain_rank))):
            inputs[f"{s}_k{k}"] = path(
                "factors", exp=wildcards.exp, rank=rank, decomp=decomp, set=s
            )
    if registry.is_localised(wildcards.method):
        inputs["selected"] = path("selected", exp=wildcards.exp)
    return inputs


def task_level_tradeoff_targets():
    """The task-level sweep's outputs (`snakemake task_level_tradeoff`; not in the default target)."""
    return [
        path("table", table="task_level_tradeoff", ext="csv"),
        path("table", table="task_level_scale_rule", ext="csv"),
        *expand(PATHS["table"], table="task_level_picked", ext=["csv", "md", "tex"]),
    ]


def task_level_costs():
    """The task-level track's cost groups: one, its experiment."""
    return {
        "": cost_components(
            TASK_LEVEL_EXP,
            TASK_LEVEL_METHODS,
            TASK_LEVEL_RANK,
            TEXT_ERASE_RULE,
            baseline_rule="task_level_baseline",
            adapters=config["lora"]["adapters"],
        )
    }


def task_level_robustness():
    """The task-level track's robustness plan: its table models of robustness.methods.task_level with the
    fine-tuned model (ceiling) and, as the floor, the checkpoint fine-tuning started from (trained on the
    retained skills, never on the forgotten one: `task_level.init: pretrained`; no floor otherwise). The
    forget set is one skill (one entity); utility: the similar skill's evaluation set.
    """
    chosen = robustness_methods("task_level", TASK_LEVEL_METHODS)
    init = task_level_init_model(SimpleNamespace(exp=TASK_LEVEL_EXP))

    def weights(wildcards):
        if wildcards.model == "init":
            return {"model": init["init"]}
        return task_level_checkpoint(wildcards)

    return {
        "exps": [TASK_LEVEL_EXP],
        "models": ["base", *(["init"] if init else [])]
        + [format_model(m, TASK_LEVEL_RANK) if m in DECOMP else m for m in chosen],
        "ceiling": "base",
        "floor": "init" if init else None,
        "weights": weights,
        "data": lambda exp: {
            "forget": path("data", exp=exp, name="forget"),
            "retain": path("data", exp=exp, name="retain"),
            "utility": path("data", exp=exp, name="eval_retain"),
        },
        "languages": lambda exp: [],
        "block": None,
        "rank": TASK_LEVEL_RANK,
        "evaluate": {
            "batch_size": (TASK_LEVEL.get("evaluate") or {}).get("batch_size", 64),
            "max_length": exp_section("finetune", TASK_LEVEL_EXP).get(
                "max_length", 128
            ),
        },
        "statistic": "answer NLL",
        "prompts": True,  # the prompt attacks apply (a text model)
    }


# the functions the generic rules call for this track (qrerase.tracks.Track.bind)
registry.TRACKS["task_level"].bind(
    targets=task_level_targets,
    costs=task_level_costs,
    tradeoff_targets=task_level_tradeoff_targets,
    finetune_start=task_level_start_inputs,
    robustness=task_level_robustness,
)
