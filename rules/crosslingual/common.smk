# Cross-lingual track: constants and input functions (its rules: rules/crosslingual/rules.smk, which includes this file).
from qrerase.tracks.crosslingual.data import SPLIT_FILES as XLING_SPLITS
from qrerase.tracks.crosslingual.data import parse_language
from qrerase.workflow.naming import format_exp
from qrerase.tracks.crosslingual import (
    LANG_PATTERN,
    ROMANISED_LANG_PATTERN,
    crosslingual_root,
)

XLING = config.get("crosslingual", {})
XLING_EXP = registry.TRACKS[
    "crosslingual"
].prefix  # the shared multilingual models' experiment
XLING_LANGS = list(XLING.get("languages", []))
XLING_UNLEARN = list(XLING.get("unlearn", []))
XLING_METHODS = list(config["methods"].get("crosslingual", []))
XLING_SETS = [
    "forget",
    "retain",
    "knowledge",
    "pretrain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
]
XLING_SHARED_DATA = [
    "finetune_full",
    "finetune_retain",
    "pretrain",
    "eval_forget",
    "eval_retain",
    "eval_real_authors",
    "eval_world_facts",
]


def xling_exp(lang=None):
    """'hi_R' -> 'xling_hi_R' (unlearning in that language); None -> the shared 'xling'."""
    return format_exp("crosslingual", lang)


def xling_vendored_root(code):
    """The folder of a (non-romanised) language's six TOFU splits: TOFU itself for English."""
    return crosslingual_root(code, config)


def xling_root(code):
    """A language's split folder: vendored, or (for '<lang>_R') the romanised copy built here."""
    base, script = parse_language(code)
    if script is None:
        return xling_vendored_root(base)
    return str(Path(path("xling_romanised", lang=code, split="x")).parent)


def xling_lang(wildcards):
    """The unlearning language of an 'xling_<lang>' experiment: 'xling_hi_R' -> 'hi_R'."""
    return parse_exp(wildcards.exp).arg


def xling_models():
    """(exp, model name) of every evaluated model: base and reference, then each method per language."""
    models = [(XLING_EXP, "base"), (XLING_EXP, "retain")]
    for code in XLING_UNLEARN:
        models += [
            (xling_exp(code), m if m in TEXT_BASELINES else format_model(m, RANK))
            for m in XLING_METHODS
        ]
    return models


def xling_model_inputs(wildcards):
    """Model name -> checkpoint: the shared base/reference models, or an exp's erased model.

    The one place that maps a cross-lingual model name to its weights: 'base', 'retain', a subspace
    method's '<method>_k<rank>' or an optimisation baseline's name (trained in exp xling_X).
    """
    if wildcards.model in ("base", "retain"):
        which = "full" if wildcards.model == "base" else "retain"
        return {"model": path("model", exp=XLING_EXP, which=which)}
    if xling_lang(wildcards) is None:
        raise WorkflowError(
            f"xling_evaluate: model '{wildcards.model}' belongs to an 'xling_<lang>' experiment"
        )
    return eval_model_inputs(wildcards)


def xling_split_files(wildcards):
    """The six split files a language's sets are cut from (tracked, so an edit re-runs them)."""
    root = xling_root(wildcards.lang)
    return [str(Path(root) / f"{s}.jsonl") for s in XLING_SPLITS]


def xling_eval_sets(wildcards):
    return {
        f"{lang}:{s}": path("xling_sets", lang=lang, name=f"eval_{s}")
        for lang in XLING_LANGS
        for s in EVAL_SETS
    }


def crosslingual_targets():
    return [
        *expand(
            PATHS["table"],
            table=["crosslingual", "crosslingual_matrix"],
            ext=["csv", "md", "tex"],
        ),
        path("figure", name="crosslingual_scatter"),
        path("figure", name="crosslingual_energy"),
        path("xling_metrics"),
        path("xling_energy"),
        *[path("energy_fig", exp=xling_exp(c)) for c in XLING_UNLEARN],
        *cost_targets("crosslingual"),
    ]


def crosslingual_costs():
    """The cross-lingual track's cost groups: one per unlearning language."""
    given = config["lora"]["adapters"]
    return {
        code: cost_components(
            xling_exp(code), XLING_METHODS, RANK, TEXT_ERASE_RULE, adapters=given
        )
        for code in XLING_UNLEARN
    }


def crosslingual_sweep():
    """(experiments, methods) of the cross-lingual trade-off sweep: each xling_X."""
    return [xling_exp(x) for x in XLING_UNLEARN], XLING_METHODS


def crosslingual_tradeoff_targets():
    return text_tradeoff_targets("crosslingual")


def crosslingual_robustness():
    """The cross-lingual track's robustness plan: per unlearning language, its models of
    robustness.methods.crosslingual with the shared fine-tuned model (ceiling) and retain reference
    (floor). Relearning trains on half A of the forget questions in the unlearning language (its
    evaluated wording, crosslingual.data.forget_split) and scores half B in every language.
    """
    chosen = robustness_methods("crosslingual", XLING_METHODS)

    def data(exp):
        lang = parse_exp(exp).arg
        return {
            "forget": path("xling_sets", lang=lang, name="eval_forget"),
            # its rows carry their paraphrased questions (the paraphrase attack)
            "paraphrases": path("xling_sets", lang=lang, name="eval_forget"),
            "retain": path("data", exp=exp, name="retain"),
            "utility": path("xling_sets", lang=lang, name="eval_retain"),
            **{
                f"forget:{other}": path("xling_sets", lang=other, name="eval_forget")
                for other in XLING_LANGS
                if other != lang
            },
        }

    return {
        "exps": [xling_exp(c) for c in XLING_UNLEARN],
        "models": ["base", "retain"]
        + [m if m in TEXT_BASELINES else format_model(m, RANK) for m in chosen],
        "ceiling": "base",
        "floor": "retain",
        "weights": xling_model_inputs,
        "data": data,
        "languages": lambda exp: [x for x in XLING_LANGS if x != parse_exp(exp).arg],
        "block": 20,
        "rank": RANK,
        "evaluate": {
            k: config["crosslingual"]["evaluate"][k]
            for k in ("batch_size", "max_length")
        },
        "statistic": "answer NLL",
        "prompts": True,  # the prompt attacks apply (a text model)
    }


# the functions the generic rules call for this track (qrerase.tracks.Track.bind)
def crosslingual_sweep_eval(wildcards):
    """A cross-lingual sweep point's evaluation (rules/studies/tradeoff_common.smk: sweep_eval): the eval sets of
    its unlearning language X (the X -> X pair) and the shared retain reference's eval log; the
    crosslingual.evaluate settings."""
    lang = parse_exp(wildcards.exp).arg
    inputs = {
        **{
            f"eval_{s}": path("xling_sets", lang=lang, name=f"eval_{s}")
            for s in EVAL_SETS
        },
        "reference": path("xling_eval", exp=XLING_EXP, model="retain"),
    }
    return inputs, XLING["evaluate"]


registry.TRACKS["crosslingual"].bind(
    targets=crosslingual_targets,
    costs=crosslingual_costs,
    tradeoff_targets=crosslingual_tradeoff_targets,
    sweep=crosslingual_sweep,
    sweep_eval=crosslingual_sweep_eval,
    robustness=crosslingual_robustness,
)
