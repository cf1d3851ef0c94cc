# Shared by every rule, in this order: config validation, globals, path patterns (path / log_path /
# benchmark_path), resources, shared input functions, the default target. Each track's constants and
# input functions are in rules/<track>_common.smk, included at the top of its rules file (the linter
# keeps functions out of rules files; qrerase.registry.TRACKS names each track's target function);
# cost tables: rules/cost.smk. Methods and their implementations: qrerase.registry (the config's
# `plugins` register more, imported by validate below).
#
# Names: the cross-lingual track is `crosslingual` wherever a user sees it (config key, track name,
# table names); its rules, scripts, path keys and experiment names keep the short prefix `xling`
# (results/xling*, rule xling_*, workflow_scripts/xling_*.py); the library says `crosslingual`.
# Experiment names are built and parsed only by qrerase.workflow.naming.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# The qrerase library of this checkout, also without an install.
sys.path.insert(0, workflow.basedir)
from qrerase import registry
from qrerase.models.gguf import resolve_gguf
from qrerase.workflow.validation import ConfigError, validate
from qrerase.workflow.launch import export_launch_env, job_params, launch_command
from qrerase.workflow.manifest import missing_artifacts
from qrerase.workflow.plan_config import refusal, rule_resources
from qrerase.workflow.stages import engine_settings, stage_recipe, track_section
from qrerase.text.tofu_log import EVAL_SETS as TOFU_EVAL_SETS
from qrerase.workflow.naming import (
    TASK_LEVEL_EXP,
    XLING_EXP,
    exp_pattern,
    format_model,
    model_exp,
    parse_exp,
    parse_model,
    size_of,
    speech_exp,
    tofu_exp,
    track_of_exp,
    xling_exp,
)

# ---------------------------------------------------------------------------------------------
# Config validation (qrerase.workflow.validation): the schema, then every cross-key check; one line
# naming the key.
# ---------------------------------------------------------------------------------------------
try:
    validate(config, Path(workflow.basedir) / "schemas" / "config.schema.yaml")
except ConfigError as exc:
    raise WorkflowError(str(exc)) from None

# Jobs import the qrerase library of this checkout, in any software environment (plain venv, conda
# envs from envs/, or a cluster node): the workflow and its library never drift apart.
os.environ.update(
    PYTHONPATH=os.pathsep.join(
        p for p in (workflow.basedir, os.environ.get("PYTHONPATH", "")) if p
    )
)

# ---------------------------------------------------------------------------------------------
# Globals: the methods (qrerase.registry), the evaluation sets.
# ---------------------------------------------------------------------------------------------
RANK = config["unlearn"]["rank"]
TOFU_METHODS = list(config["methods"]["tofu"])
DECOMP = registry.DECOMP  # subspace method -> 'svd' | 'cpqr'
# the text baselines (the text runner's: the tofu and crosslingual tracks and the size study)
TEXT_BASELINES = registry.baselines_for("tofu")
# The control of the selectivity diagnostic: '<method>_control' is the same edit built with the roles
# of the two adapters swapped (T_f := T_r, P_r from T_f), on the same layers (unlearn.control).
CONTROL = registry.CONTROL_SUFFIX
CONTROLS = [f"{m}{CONTROL}" for m in config["unlearn"].get("control", [])]
# The TOFU evaluation sets: the one list, qrerase.text.tofu_log
EVAL_SETS = list(TOFU_EVAL_SETS)
# Experiments with causal-LM models (the text rules), and the text experiments that unlearn.
# (size_h<W>_s<S>: the size study's TOFU experiments, rules/size_study.smk)
TEXT_EXPS = exp_pattern(
    "tofu_<split>", "xling", "xling_<lang>", "task_level", "size_<shape>"
)
UNLEARN_EXPS = exp_pattern("tofu_<split>", "xling_<lang>", "size_<shape>")


def method_decomp(method):
    """'qr_erase_ll' or 'qr_erase_ll_control' -> 'cpqr'."""
    return DECOMP[method.removesuffix(CONTROL)]


# ---------------------------------------------------------------------------------------------
# Path patterns: every artifact path of the workflow, in one table.
# ---------------------------------------------------------------------------------------------
PATHS = {
    "data": "results/{exp}/data/{name}.jsonl",
    "tokenizer": "results/{exp}/models/tokenizer",
    "model": "results/{exp}/models/{which}",
    "train_curve": "results/{exp}/models/{which}_loss.csv",
    "imported": "results/{exp}/models/imported",
    "lora": "results/{exp}/lora/{set}",
    "lora_curve": "results/{exp}/lora/{set}_loss.csv",
    "task_matrix": "results/{exp}/task_matrices/{set}.safetensors",
    "factors": "results/{exp}/factors/k{rank}/{decomp}_{set}.safetensors",
    "factor_report": "results/{exp}/factors/k{rank}/report.csv",
    "energy": "results/{exp}/energy/energy.csv",
    "selected": "results/{exp}/energy/selected_layers.json",
    "energy_fig": "results/figures/{exp}_energy.png",
    "update": "results/{exp}/updates/k{rank}/{decomp}.safetensors",
    "update_control": "results/{exp}/updates/k{rank}/{decomp}_control.safetensors",
    "erase_adapter": "results/{exp}/erase/k{rank}/{method}/adapter",
    "erased_model": "results/{exp}/erase/k{rank}/{method}/model",
    "eval": "results/{exp}/eval/{model}",
    "metrics": "results/{exp}/metrics/{model}.csv",
    "baseline_model": "results/{exp}/baselines/{method}/model",
    "baseline_curve": "results/{exp}/baselines/{method}_loss.csv",
    "probe": "results/{exp}/probe/{which}_memorisation.csv",
    # cross-lingual track
    "xling_romanised": "results/xling/romanised/{lang}/{split}.jsonl",
    "xling_sets": "results/xling/languages/{lang}/{name}.jsonl",
    "xling_eval": "results/{exp}/eval_languages/{model}",
    "xling_metrics": "results/xling/metrics.csv",
    "xling_energy": "results/xling/energy.csv",
    # speech track
    "speech_audio": "results/{exp}/data/audio.safetensors",
    "speech_index": "results/{exp}/data/index.csv",
    "speech_meta": "results/{exp}/data/meta.json",
    "speech_eval": "results/{exp}/speech_eval/{model}.csv",
    "speech_mia": "results/{exp}/speech_eval/{model}_mia.json",
    "speech_baseline": "results/{exp}/baselines/{method}/model",
    "speech_baseline_curve": "results/{exp}/baselines/{method}/loss.csv",
    "speech_pretrained": "results/{exp}/models/pretrained",
    "speech_pretrain_curve": "results/{exp}/models/pretrained_loss.csv",
    "speech_tradeoff_points": "results/{exp}/tradeoff/{method}.csv",
    # task-level track
    "task_level_eval": "results/{exp}/task_level_eval/{model}.csv",
    "task_level_metrics": "results/task_level/metrics.csv",
    "task_level_tradeoff_points": "results/{exp}/tradeoff/points/{method}.csv",
    # trade-off sweeps
    "tradeoff_erase": "results/{exp}/tradeoff/k{rank}/{method}/lambda{scale}.csv",
    "tradeoff_baseline": "results/{exp}/tradeoff/baselines/{method}_e{epochs}.csv",
    "tradeoff_selection": "results/tables/{track}_tradeoff_selection.csv",
    # size study
    "size_study_rows": "results/{exp}/size_study/rows.csv",
    "size_study_layers": "results/{exp}/size_study/layers.csv",
    # shared outputs, benchmarks, logs
    "table": "results/tables/{table}.{ext}",
    "figure": "results/figures/{name}.png",
    "bench": "results/bench/{name}.csv",
    "benchmark": "results/benchmarks/{rule}/{name}.tsv",
    "log": "results/logs/{rule}/{name}.log",
    "manifest": "results/provenance/manifest.json",
}


def path(key, **wildcards):
    """Fill a path pattern; unfilled wildcards stay as {name} for rule declarations."""
    return PATHS[key].format_map(_Keep(wildcards))


class _Keep(dict):
    def __missing__(self, key):
        return f"{{{key}}}"


def _job_name(rule_name, wildcard_names, values):
    name = "_".join(f"{{{w}}}" for w in wildcard_names) or rule_name
    return name.format_map(_Keep(values))


def log_path(rule_name, *wildcard_names):
    """A rule's log file: results/logs/<rule>/<wildcard values joined by '_'>.log."""
    name = _job_name(rule_name, wildcard_names, {})
    return PATHS["log"].format(rule=rule_name, name=name)


def benchmark_path(rule_name, *wildcard_names, **values):
    """Snakemake benchmark file (wall time, RSS) of a rule's job: results/benchmarks/<rule>/<wcs>.tsv.

    With ``values`` (wildcard name -> value) one job's file, as the cost table reads it.
    """
    name = _job_name(rule_name, wildcard_names, values)
    return PATHS["benchmark"].format(rule=rule_name, name=name)


wildcard_constraints:
    exp=exp_pattern(),
    name=r"[a-z_]+",
    which="full|retain|pretrained",
    set="forget|retain",
    rank=r"\d+",
    decomp="|".join(registry.DECOMPOSITIONS),
    method="|".join([*DECOMP, *(f"{m}{CONTROL}" for m in DECOMP)]),
    model=r"[A-Za-z0-9_.-]+",


# ---------------------------------------------------------------------------------------------
# Resources.
# ---------------------------------------------------------------------------------------------
def resources_for(kind):
    """Snakemake resources of a rule kind (train / evaluate / linalg / light), from the memory plan.

    qrerase.workflow.plan_config.rule_resources: mem_mb (host), runtime (min), gpu (= processes on a
    GPU device; linalg and light jobs ask for none), nodes, cpus_per_task, as the slurm executor
    plugin reads them; config `resources.<kind>.<key>` overrides each (`qrerase plan` prints the plan).
    """
    return _RESOURCES[kind]


try:
    _RESOURCES = {
        kind: rule_resources(config, kind, threads=config["threads"])
        for kind in ("train", "evaluate", "linalg", "light")
    }
    # a job that does not fit its GPUs: refused (one line) before any job runs
    _REFUSED = refusal(config)
except ValueError as exc:
    raise WorkflowError(f"resources (the memory plan): {exc}") from None
if _REFUSED:
    raise WorkflowError(_REFUSED)


# ---------------------------------------------------------------------------------------------
# Launching training jobs (qrerase.workflow.launch): a `shell:` command, so `snakemake -n -p` shows
# it; `accelerate launch --num_processes N` when resources.<kind>.processes N > 1.
# ---------------------------------------------------------------------------------------------
export_launch_env(sys.executable, workflow.basedir)


def launch(script, kind="train"):
    """The shell command of a training rule (qrerase.workflow.launch.launch_command)."""
    from snakemake.settings.types import DeploymentMethod

    deployed = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    return launch_command(config, script, kind, conda=deployed)


def launch_params(rule_name, **params):
    """A training rule's params plus `job`, its JSON job spec (qrerase.workflow.launch.job_params)."""
    return job_params(config, rule_name, params)


# ---------------------------------------------------------------------------------------------
# Shared input functions and config lookups (the generic model -> lora -> erase -> evaluate chain).
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# The default target: each configured track's bound `targets()` (rules/<track>_common.smk).
# ---------------------------------------------------------------------------------------------
def all_targets():
    """Each configured track's targets, and the trade-off sweeps when tradeoff.in_default_target."""
    targets = [
        t
        for track in config["tracks"]
        for t in registry.TRACKS[track].function("targets")()
    ]
    if config.get("tradeoff", {}).get("in_default_target"):
        targets += tradeoff_targets()
    return targets + robustness_default_targets()


def manifest_holes():
    """Artifacts of the last run's manifest that are missing now and lead to a target
    (qrerase.workflow.manifest.missing_artifacts): the default target names them, so that a plain rerun
    remakes what a kill during a --forcerun, or a deletion, left missing (docs/recovery.md).
    """
    targets = all_targets()
    return [p for p in missing_artifacts(targets) if p not in targets]
