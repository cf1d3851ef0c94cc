# Task-level track: config validation, names, path patterns and input functions (rules in task.smk).
from qrerase.text.task import EVAL_FILES as TASK_EVAL_FILES
from qrerase.text.task import ROLES as TASK_ROLES
from qrerase.text.task import TaskDataConfig, check_task_config
from qrerase.baselines.task import TASK_BASELINES

TASK = config.get("task", {})
TASK_EXP = "task"
TASK_METHODS = list(config["methods"].get("task", []))
TASK_RANK = TASK.get("rank", RANK)
TASK_DATA_SETS = [
    "forget",
    "retain",
    "new",
    "finetune_full",
    *(f for files in TASK_EVAL_FILES.values() for f in files),
]

PATHS.update(
    {
        "task_eval": "results/{exp}/task_eval/{model}.csv",
        "task_metrics": "results/task/metrics.csv",
    }
)


def validate_task_config(cfg):
    """The task section (after the schema): skills, split sizes, operand ranges, data files; rank."""
    if "task" not in cfg["tracks"]:
        return
    if "task" not in cfg or "task" not in cfg["methods"]:
        raise WorkflowError(
            "config key 'task': the task track needs a 'task' section and 'methods.task'"
        )
    try:
        check_task_config(TaskDataConfig.from_dict(cfg["task"]["data"]))
    except (ValueError, TypeError) as exc:
        key, _, message = str(exc).partition(": ")
        raise WorkflowError(f"config key '{key}': {message}") from None
    rank = cfg["task"].get("rank", cfg["unlearn"]["rank"])
    lora_r = cfg["lora"]["r"]
    if rank > lora_r and not any(cfg["lora"]["adapters"].values()):
        raise WorkflowError(
            f"config key 'task.rank': {rank} exceeds the LoRA rank lora.r={lora_r}"
        )
    for i, method in enumerate(cfg["methods"]["task"]):
        if method in TASK_BASELINES and not cfg["task"]["baselines"].get(method):
            raise WorkflowError(
                f"config key 'methods.task.{i}': baseline '{method}' has no 'task.baselines.{method}' settings"
            )


validate_task_config(config)


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
    # KGA's A_f and A_n start from the fine-tuning's initial checkpoint
    if wildcards.method == "kga":
        inputs.update(task_start_inputs(wildcards))
    return inputs


def task_costs():
    """The cost table's components per method (rules/common.smk cost_components)."""
    return cost_components(
        TASK_EXP,
        TASK_METHODS,
        TASK_RANK,
        "erase_merged" if "merged" in config["erase"]["outputs"] else "erase_adapter",
        baseline_rule="task_baseline",
        adapters=config["lora"]["adapters"],
    )


def task_targets():
    return [
        *expand(PATHS["table"], table=["task", "task_wide"], ext=["csv", "md", "tex"]),
        path("task_metrics"),
        path("energy_fig", exp=TASK_EXP),
        path("factor_report", exp=TASK_EXP, rank=TASK_RANK),
        *cost_targets("task"),
    ]


TRACK_TARGETS["task"] = task_targets
