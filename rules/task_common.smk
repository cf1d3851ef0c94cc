# Task-level track: constants and input functions (its rules: rules/task.smk, which includes this file).
from qrerase.text.task import EVAL_FILES as TASK_EVAL_FILES
from qrerase.text.task import ROLES as TASK_ROLES

TASK = config.get("task", {})
TASK_METHODS = list(config["methods"].get("task", []))
TASK_BASELINES = registry.baselines_for("task")
TASK_RANK = TASK.get("rank", RANK)
TASK_DATA_SETS = [
    "forget",
    "retain",
    "new",
    "finetune_full",
    *(f for files in TASK_EVAL_FILES.values() for f in files),
]


def task_init_model(wildcards):
    """The checkpoint the task model is fine-tuned from (and KGA's auxiliary models start from).

    {}: from scratch (the tiny model built from the tokenizer with the seed, or model.name_or_path).
    A pretraining stage plugs in here: return {"init": <pretrained checkpoint directory>}.
    """
    return {}


def task_start_inputs(wildcards):
    """What the task model starts from: task_init_model's checkpoint, else a new tiny model on the
    run's tokenizer (nothing for a hub model, loaded by name)."""
    init = task_init_model(wildcards)
    if init or not tiny_model():
        return init
    return {"tokenizer": path("tokenizer", exp=wildcards.exp)}


def task_data_files(wildcards):
    """The vendored knowledge files the generator reads (an edit re-runs everything downstream)."""
    data = TASK.get("data", {})
    if "knowledge" not in [data.get(r) for r in TASK_ROLES]:
        return []
    know = data.get("knowledge", {})
    root = Path(know.get("root", "data/tofu"))
    return [
        str(root / f"{s}.jsonl")
        for s in know.get("sources", ["world_facts", "real_authors"])
    ]


def task_models():
    """Evaluated models: base, then each method (subspace methods at rank k: '<method>_k<rank>')."""
    return ["base"] + [f"{m}_k{TASK_RANK}" if m in DECOMP else m for m in TASK_METHODS]


def task_checkpoint(wildcards):
    """Model name -> weights: base, a baseline's checkpoint, a merged erase, or base + erase adapter."""
    model = wildcards.model
    if model == "base":
        return {"model": base_model(wildcards)}
    if model in TASK_BASELINES:
        return {"model": path("baseline_model", exp=wildcards.exp, method=model)}
    if split_model(model)[1] is None:
        raise WorkflowError(f"task_evaluate: unknown model '{model}'")
    return eval_model_inputs(wildcards)


def task_baseline_inputs(wildcards):
    inputs = {
        "model": base_model(wildcards),
        **{
            s: path("data", exp=wildcards.exp, name=s)
            for s in ("forget", "retain", "new")
        },
    }
    # KGA's A_f and A_n start from the fine-tuning's initial checkpoint (the 'initial' input)
    if "initial" in registry.method(wildcards.method).inputs:
        inputs.update(task_start_inputs(wildcards))
    return inputs


def task_targets():
    return [
        *expand(PATHS["table"], table=["task", "task_wide"], ext=["csv", "md", "tex"]),
        path("task_metrics"),
        path("energy_fig", exp=TASK_EXP),
        path("factor_report", exp=TASK_EXP, rank=TASK_RANK),
        *cost_targets("task"),
    ]
