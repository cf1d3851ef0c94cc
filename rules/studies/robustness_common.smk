# The robustness stage: constants and input functions (its rules: rules/studies/robustness.smk). A track takes
# part by binding a plan function (role `robustness`, qrerase.tracks.Track.bind) in its rules/<track>/common.smk.
from types import SimpleNamespace

from snakemake.logging import logger

from qrerase.robustness.quantization import missing_backend
from qrerase.robustness.settings import (
    check_prompt_room,
    model_context,
    robustness_settings,
)
from qrerase.workflow.naming import track_of_exp

ROBUSTNESS = config.get("robustness") or {}
# the settings an attack job runs with (what to attack and which tables to build are not among them)
ROBUSTNESS_JOB = {
    k: v
    for k, v in ROBUSTNESS.items()
    if k not in ("tracks", "methods", "in_default_target", "rule_lambda")
}
# '<method>_k<rank>' + this: the subspace method at the lambda its track's lambda rule picks on the held-out
# slice (results/tables/<track>_tradeoff_selection.csv), built in the job from the fine-tuned model
RULE = "_rule"


def robustness_prompt_attacks(plan):
    """The prompt attacks a track's jobs run: those configured that its plan allows (a text model's, `prompts`;
    the paraphrase attack only with a `paraphrases` file among its data)."""
    if not plan.get("prompts"):
        return []
    has_paraphrases = all("paraphrases" in plan["data"](exp) for exp in plan["exps"])
    return [
        a
        for a in robustness_settings(ROBUSTNESS).prompt_attacks
        if a != "paraphrase" or has_paraphrases
    ]


def check_robustness_plans():
    """Planning-time bounds of the prompt attacks on every track the stage builds (check_prompt_room), and a
    note for each optional quantization format whose package is missing; a one-line WorkflowError naming the key.
    """
    settings = robustness_settings(ROBUSTNESS)
    for fmt in settings.optional_formats:
        if missing_backend(fmt):
            logger.info(
                f"robustness.optional_formats: {fmt} skipped ({missing_backend(fmt)})"
            )
    context = model_context(config["model"])
    for track in robustness_tracks():
        plan = robustness_plan(track)
        if not robustness_prompt_attacks(plan):
            continue
        try:
            check_prompt_room(settings, track, plan["block"], context)
        except ValueError as exc:
            raise WorkflowError(str(exc)) from None


def robustness_methods(track, methods):
    """The methods of a track the stage attacks: robustness.methods.<track> (null or absent: all)."""
    chosen = (ROBUSTNESS.get("methods") or {}).get(track)
    return list(methods) if chosen is None else [m for m in methods if m in chosen]


def robustness_plan(track):
    """A track's robustness plan (its bound `robustness()`, qrerase.tracks.Track.bind): dict with exps, models, ceiling,
    floor, weights(wildcards), data(exp) (with `paraphrases` where the forget questions have them), languages(exp),
    block, rank, evaluate, statistic and, for a text model, prompts (True: the prompt attacks apply).
    """
    return registry.TRACKS[track].function("robustness")()


def robustness_tracks():
    """The tracks of `snakemake robustness`: robustness.tracks (null: the configured `tracks`) that declare a
    robustness plan."""
    chosen = ROBUSTNESS.get("tracks")
    return [
        t
        for t in (config["tracks"] if chosen is None else chosen)
        if registry.TRACKS[t].function("robustness") is not None
    ]


def robustness_rule_models(track):
    """The subspace models of a track's robustness plan at its lambda rule's pick (robustness.rule_lambda
    and a track with a text sweep; others: none, e.g. speech, whose table lambda is its rule's pick).
    """
    if not ROBUSTNESS.get("rule_lambda", True) or not registry.TRACKS[track].function(
        "sweep"
    ):
        return []
    plan = robustness_plan(track)
    return [m + RULE for m in plan["models"] if split_model(m)[1] is not None]


def robustness_outputs(t, variant=""):
    """Track t's robustness tables and figures (variant "" or RULE): the outputs of its table rule
    (robustness_table_outputs) with the track filled in."""
    outputs = robustness_table_outputs(variant)
    parts = (
        "table_csv",
        "table_md",
        "subspace_csv",
        "subspace_md",
        "figure",
        "subspace_figure",
    )
    return [str(outputs[part]).replace("{track}", t) for part in parts]


def robustness_targets(tracks=None):
    """Each track's robustness tables and figures, and those at its lambda rule's pick where it has one."""
    out = []
    for t in robustness_tracks() if tracks is None else tracks:
        out += robustness_outputs(t)
        if robustness_rule_models(t):
            out += robustness_outputs(t, RULE)
    return out


def robustness_default_targets():
    """The robustness tables of the default target (robustness.in_default_target, configured tracks only;
    the table models only: the lambda rule's need the trade-off sweep)."""
    wanted = ROBUSTNESS.get("in_default_target") or []
    return [
        out
        for t in config["tracks"]
        if t in wanted and registry.TRACKS[t].function("robustness") is not None
        for out in robustness_outputs(t)
    ]


def _plan_of(exp):
    return robustness_plan(track_of_exp(exp).name)


def robustness_inputs(wildcards):
    """The attacked model's weights, the ceiling's checkpoint, the track's data files and the subspace
    diagnostic's (diagnostic_inputs: the task matrices' factors, the erase updates)."""
    plan = _plan_of(wildcards.exp)
    ceiling = SimpleNamespace(exp=wildcards.exp, model=plan["ceiling"])
    model = wildcards.model.removesuffix(RULE)
    if (
        model != wildcards.model
    ):  # built in the job: the ceiling's weights, the update at the rule's lambda
        track = track_of_exp(wildcards.exp).name
        inputs = {
            "model": plan["weights"](ceiling)["model"],
            "selection": path("tradeoff_selection", track=track),
        }
    else:
        inputs = dict(plan["weights"](wildcards))
    inputs["ceiling"] = plan["weights"](ceiling)["model"]
    data = plan["data"](wildcards.exp)
    inputs.update({k: data[k] for k in ("retain", "utility")})
    inputs["halves"] = (
        f"results/{wildcards.exp}/robustness/halves"  # A.jsonl, B.jsonl, B_<lang>.jsonl
    )
    inputs.update(diagnostic_inputs(wildcards.exp, model, plan))
    return inputs


def robustness_params(wildcards):
    """The job's settings: the track's training rates, its LoRA shape and its evaluation batch."""
    exp = wildcards.exp
    plan = _plan_of(exp)
    finetune, lora = exp_section("finetune", exp), exp_section("lora", exp)
    return {
        "rates": {
            "full": [finetune["lr"], finetune["batch_size"]],
            "lora": [lora["lr"], lora["batch_size"]],
        },
        "max_length": finetune.get("max_length", 128),
        "lora_shape": {k: lora[k] for k in ("r", "alpha", "dropout", "target_modules")},
        "evaluate": plan["evaluate"],
        "languages": plan["languages"](exp),
        "block": plan["block"],
        "rank": plan["rank"],
        "scale": erase_scale(
            exp
        ),  # the lambda of the erase update file (a _rule model rescales it)
        "rule": dict(
            zip(("method", "rank"), split_model(wildcards.model.removesuffix(RULE)))
        ),
        "prompt_attacks": robustness_prompt_attacks(plan),
    }


def robustness_table_models(track, variant):
    """The models of a robustness table: the plan's, or (variant RULE) its references and rule models."""
    plan = robustness_plan(track)
    if variant == RULE:
        refs = [m for m in (plan["ceiling"], plan["floor"]) if m]
        return refs + robustness_rule_models(track)
    return plan["models"]


def robustness_table_inputs(wildcards, variant=""):
    plan = robustness_plan(wildcards.track)
    return {
        f"{exp}:{m}{suffix}": f"results/{exp}/robustness/{m}{suffix}.csv"
        for exp in plan["exps"]
        for m in robustness_table_models(wildcards.track, variant)
        for suffix in ("", "_subspace")
    }


def robustness_table_params(wildcards, variant=""):
    plan = robustness_plan(wildcards.track)
    keep = ("exps", "ceiling", "floor", "statistic")
    return {
        **{k: v for k, v in plan.items() if k in keep},
        "models": robustness_table_models(wildcards.track, variant),
        "variant": variant,
    }


def robustness_table_outputs(suffix):
    """A robustness table rule's outputs ("" or "_rule": at the lambda rule), each in the report: the
    recovery and the subspace tables (csv, md) and their figures."""
    outputs = {}
    for part, name in (("table", ""), ("subspace", "_subspace")):
        stem = f"{{track}}_robustness{suffix}{name}"
        kw = dict(
            caption=f"../../report/robustness_{part}.rst",
            category="Robustness",
            subcategory="{track}",
        )
        for ext in ("csv", "md"):
            outputs[f"{part}_{ext}"] = report(
                path("table", table=stem, ext=ext),
                labels={"table": stem, "format": ext},
                **kw,
            )
        figure = "figure" if part == "table" else "subspace_figure"
        outputs[figure] = report(
            path("figure", name=stem), labels={"figure": stem}, **kw
        )
    return outputs


check_robustness_plans()
