# Shared by every rule, in this order: config validation, globals, path patterns (path / log_path /
# benchmark_path: qrerase.workflow.paths), resources, the launch of training jobs
# (qrerase.workflow.launch), the default target. The text chain's input functions are in
# rules/core/common.smk; each track's constants and input functions in rules/<track>/common.smk,
# which binds the functions the generic rules call to its Track (qrerase.tracks.Track.bind); cost
# tables: rules/studies/cost.smk. Methods and their implementations: qrerase.registry (the config's `plugins`
# register more, imported by validate below).
#
# Names: the cross-lingual track is `crosslingual` wherever a user sees it (config key, track name,
# table names, its folders); its rules, path keys and experiment names keep the short prefix `xling`
# (results/xling*, rule xling_*).
# Experiment names are built and parsed only by qrerase.workflow.naming.
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

# The qrerase library of this checkout, also without an install.
sys.path.insert(0, workflow.basedir)
from qrerase import registry
from qrerase.io import load_yaml
from qrerase.models.gguf import resolve_gguf
from qrerase.workflow.validation import ConfigError, validate
from qrerase.workflow.launch import export_launch_env, job_params, launch_command
from qrerase.workflow.manifest import missing_artifacts
from qrerase.workflow.paths import all_paths, benchmark_path, fill, log_path
from qrerase.workflow.plan_config import (
    RESOURCE_CLASSES,
    refusal,
    retype_config_args,
    rule_resources,
)
from qrerase.workflow.stages import engine_settings, stage_recipe, track_section
from qrerase.text import eval_log
from qrerase.workflow.naming import (
    exp_pattern,
    language_model_templates,
    text_unlearning_templates,
    format_model,
    model_exp,
    parse_exp,
    parse_model,
    size_of,
    track_of_exp,
)

# ---------------------------------------------------------------------------------------------
# Config validation (qrerase.workflow.validation): the schema, then every cross-key check; one line
# naming the key.
# ---------------------------------------------------------------------------------------------
try:
    # Snakemake keeps the last of a repeated key; each config file is read again to refuse one
    for _configfile in workflow.configfiles:
        load_yaml(_configfile)
    # `--config unlearn={rank: 4}`: Snakemake leaves nested values strings; typed as in a config file
    retype_config_args(config, workflow.config_settings.config_args)
    validate(config, Path(workflow.basedir) / "schemas" / "config.schema.yaml")
except (ConfigError, ValueError) as exc:
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
DECOMP = registry.DECOMP  # subspace method -> 'svd' | 'cpqr'
# the text baselines (the text runner's: the tofu and crosslingual tracks and the size study)
TEXT_BASELINES = registry.baselines_of_runner("text")
# The control of the selectivity diagnostic: '<method>_control' is the same edit built with the roles
# of the two adapters swapped (T_f := T_r, P_r from T_f), on the same layers (unlearn.control).
CONTROL = registry.CONTROL_SUFFIX
CONTROLS = [f"{m}{CONTROL}" for m in config["unlearn"].get("control", [])]
# The evaluation sets of an eval log (the text tracks): the one list, qrerase.text.eval_log
EVAL_SETS = list(eval_log.EVAL_SETS)
# Experiments with causal-LM models (the text rules), and the text experiments that unlearn.
# (size_h<W>_s<S>: the size study's TOFU experiments, rules/studies/size_study.smk)
TEXT_EXPS = exp_pattern(*language_model_templates())
UNLEARN_EXPS = exp_pattern(*text_unlearning_templates())


def method_decomp(method):
    """'qr_erase_ll' or 'qr_erase_ll_control' -> 'cpqr'."""
    return DECOMP[method.removesuffix(CONTROL)]


# ---------------------------------------------------------------------------------------------
# Path patterns: every artifact path of the workflow, in one table.
# ---------------------------------------------------------------------------------------------
# every track's patterns (qrerase.workflow.paths: the shared ones and each track's Track.paths)
PATHS = all_paths(registry.TRACKS)


def path(key, **wildcards):
    """Fill a path pattern; unfilled wildcards stay as {name} for rule declarations."""
    return fill(PATHS[key], **wildcards)


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
def resources_for(resource_class):
    """Snakemake resources of a resource class (train / evaluate / linalg / light), from the memory plan.

    qrerase.workflow.plan_config.rule_resources: mem_mb (host), runtime (min), gpu (= processes on a
    GPU device; linalg and light jobs ask for none), nodes, cpus_per_task, as the slurm executor
    plugin reads them; config `resources.<class>.<key>` overrides each (`qrerase plan` prints the plan).
    """
    return _RESOURCES[resource_class]


try:
    _RESOURCES = {
        c: rule_resources(config, c, threads=config["threads"])
        for c in RESOURCE_CLASSES
    }
    # a job that does not fit its GPUs: refused (one line) before any job runs
    _REFUSED = refusal(config)
except ValueError as exc:
    raise WorkflowError(f"resources (the memory plan): {exc}") from None
if _REFUSED:
    raise WorkflowError(_REFUSED)


# ---------------------------------------------------------------------------------------------
# Launching training jobs (qrerase.workflow.launch): a `shell:` command, so `snakemake -n -p` shows
# it; `accelerate launch --num_processes N` when resources.<class>.processes N > 1.
# ---------------------------------------------------------------------------------------------
export_launch_env(sys.executable, workflow.basedir)


def launch(script, resource_class="train"):
    """The shell command of a training rule (qrerase.workflow.launch.launch_command)."""
    from snakemake.settings.types import DeploymentMethod

    deployed = DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method
    return launch_command(config, script, resource_class, conda=deployed)


def launch_params(rule_name, **params):
    """A training rule's params plus `job`, its JSON job spec (qrerase.workflow.launch.job_params)."""
    return job_params(config, rule_name, params)


# ---------------------------------------------------------------------------------------------
# The default target: each configured track's bound `targets()` (rules/<track>/common.smk).
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
