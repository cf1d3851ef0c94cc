# Cross-lingual track: shared multilingual models (exp "xling"), unlearning in language X (exp
# "xling_X", through the generic lora -> task_matrices -> ... -> erase_merged chain), evaluation of
# every model in every configured language. (Naming rule: rules/common.smk, top.)


include: "common.smk"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../../workflow_scripts/crosslingual/romanise.py"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        root=lambda wc: xling_root(wc.lang),
        data=XLING.get("data"),
        max_questions=XLING.get("evaluate", {}).get("max_questions"),
    script:
        "../../workflow_scripts/crosslingual/sets.py"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        languages=XLING_LANGS,
    script:
        "../../workflow_scripts/crosslingual/data.py"


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
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    script:
        "../../workflow_scripts/crosslingual/unlearn_data.py"


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
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        languages=XLING_LANGS,
        model=config["model"],
        evaluate=XLING.get("evaluate"),
        seed=config["seed"],
    script:
        "../../workflow_scripts/core/evaluate.py"


rule xling_table:
    # Metrics of every model in every language, the two cross-lingual tables and the scatter figure.
    input:
        logs=[path("xling_eval", exp=e, model=m) for e, m in xling_models()],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption=f"{table}_table.rst",
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
            caption="crosslingual_scatter.rst",
            category="Cross-lingual",
            subcategory="Figures",
            labels={"figure": "utility vs forget quality"},
        ),
    log:
        log_path("xling_table"),
    conda:
        "../../envs/tables.yaml"
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
        "../../workflow_scripts/crosslingual/table.py"


rule xling_energy:
    # Per-unlearning-language task energies side by side: do the same layers carry the fact?
    input:
        [path("energy", exp=xling_exp(c)) for c in XLING_UNLEARN],
    output:
        csv=path("xling_energy"),
        figure=report(
            path("figure", name="crosslingual_energy"),
            caption="crosslingual_energy.rst",
            category="Cross-lingual",
            subcategory="Figures",
            labels={"figure": "energy per language"},
        ),
    log:
        log_path("xling_energy"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        unlearn=XLING_UNLEARN,
    script:
        "../../workflow_scripts/crosslingual/energy.py"
