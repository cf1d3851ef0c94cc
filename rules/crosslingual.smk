# Cross-lingual track: shared multilingual models (exp "xling"), unlearning in language X (exp
# "xling_X", through the generic lora -> task_matrices -> ... -> erase_merged chain), evaluation of
# every model in every configured language. (Naming rule: rules/common.smk, top.)
from qrerase.text.multilingual import SPLIT_FILES as XLING_SPLITS
from qrerase.text.multilingual import parse_language
from qrerase.workflow.config import crosslingual_root
from qrerase.workflow.naming import LANG_PATTERN, ROMANISED_LANG_PATTERN

XLING = config.get("crosslingual", {})
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
            (xling_exp(code), m if m in BASELINES else f"{m}_k{RANK}")
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


rule xling_romanise:
    # '<lang>_R': every text field of the six splits transliterated (the vendored files stay untouched).
    input:
        lambda wc: [
            str(Path(xling_vendored_root(parse_language(wc.lang)[0])) / f"{s}.jsonl")
            for s in XLING_SPLITS
        ],
    output:
        **{s: path("xling_romanised", split=s) for s in XLING_SPLITS},
    log:
        log_path("xling_romanise", "lang"),
    wildcard_constraints:
        lang=ROMANISED_LANG_PATTERN,
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../workflow_scripts/xling_romanise.py"


rule xling_sets:
    # One language's forget / retain / knowledge training QA and its four evaluation sets.
    input:
        xling_split_files,
    output:
        **{name: path("xling_sets", name=name) for name in XLING_SETS},
    log:
        log_path("xling_sets", "lang"),
    wildcard_constraints:
        lang=LANG_PATTERN,
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        root=lambda wc: xling_root(wc.lang),
        data=XLING.get("data"),
        max_questions=XLING.get("evaluate", {}).get("max_questions"),
    script:
        "../workflow_scripts/xling_sets.py"


rule xling_data:
    # The shared models' training sets (forget + retain + knowledge of every language, and the
    # reference's retain + knowledge) and all evaluation text (for the tokenizer).
    input:
        **{
            f"{lang}:{name}": path("xling_sets", lang=lang, name=name)
            for lang in XLING_LANGS
            for name in XLING_SETS
        },
    output:
        **{name: path("data", exp=XLING_EXP, name=name) for name in XLING_SHARED_DATA},
    log:
        log_path("xling_data"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        languages=XLING_LANGS,
    script:
        "../workflow_scripts/xling_data.py"


rule xling_unlearn_data:
    # exp xling_X: forget_X and retain_X, where the generic lora rule reads them.
    input:
        forget=lambda wc: path("xling_sets", lang=xling_lang(wc), name="forget"),
        retain=lambda wc: path("xling_sets", lang=xling_lang(wc), name="retain"),
    output:
        forget=path("data", name="forget"),
        retain=path("data", name="retain"),
    log:
        log_path("xling_unlearn_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("xling_<lang>"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../workflow_scripts/xling_unlearn_data.py"


rule xling_evaluate:
    # One model, loaded once, through the TOFU protocol in every configured language.
    input:
        unpack(xling_model_inputs),
        unpack(xling_eval_sets),
    output:
        directory(path("xling_eval")),
    log:
        log_path("xling_evaluate", "exp", "model"),
    wildcard_constraints:
        exp=exp_pattern("xling", "xling_<lang>"),
    conda:
        "../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        languages=XLING_LANGS,
        model=config["model"],
        evaluate=XLING.get("evaluate"),
        seed=config["seed"],
    script:
        "../workflow_scripts/xling_evaluate.py"


rule xling_table:
    # Metrics of every model in every language, the two cross-lingual tables and the scatter figure.
    input:
        logs=[path("xling_eval", exp=e, model=m) for e, m in xling_models()],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption=f"../report/{table}_table.rst",
                category="Cross-lingual",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("crosslingual", "crosslingual_matrix")
            for ext in ("csv", "md", "tex")
        },
        metrics=path("xling_metrics"),
        scatter=report(
            path("figure", name="crosslingual_scatter"),
            caption="../report/crosslingual_scatter.rst",
            category="Cross-lingual",
            subcategory="Figures",
            labels={"figure": "utility vs forget quality"},
        ),
    log:
        log_path("xling_table"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        models=xling_models(),
        languages=XLING_LANGS,
        unlearn=XLING_UNLEARN,
        methods=XLING_METHODS,
        table_method=XLING.get("table_method"),
        rank=RANK,
    script:
        "../workflow_scripts/xling_table.py"


rule xling_energy:
    # Per-unlearning-language task energies side by side: do the same layers carry the fact?
    input:
        [path("energy", exp=xling_exp(c)) for c in XLING_UNLEARN],
    output:
        csv=path("xling_energy"),
        figure=report(
            path("figure", name="crosslingual_energy"),
            caption="../report/crosslingual_energy.rst",
            category="Cross-lingual",
            subcategory="Figures",
            labels={"figure": "energy per language"},
        ),
    log:
        log_path("xling_energy"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        unlearn=XLING_UNLEARN,
    script:
        "../workflow_scripts/xling_energy.py"
