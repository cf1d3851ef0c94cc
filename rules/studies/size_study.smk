# The model-size study (`snakemake size_study --cores 2`; not in the default target): the TOFU
# track's chain at every width of size_study.widths and seed of size_study.seeds (experiments
# size_h<W>_s<S>, served by the TOFU rules), each swept over lambda / epochs (rules/studies/tradeoff.smk);
# per width and method the selectivity at a 0.1-nat held-out retain rise, Forget Quality and utility
# at the lambda rule's pick, the forget/retain principal angles and the effective number of layers.


include: "size_study_common.smk"


rule size_study_exp:
    # One experiment's rows: per method the sweep measures, plus its mechanistic measures.
    input:
        unpack(size_exp_inputs),
    output:
        rows=path("size_study_rows"),
        layers=path("size_study_layers"),
    log:
        log_path("size_study_exp", "exp"),
    wildcard_constraints:
        exp=exp_pattern("size_<shape>"),
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        target=SIZE.get("selectivity_rise", 0.1),
        max_rise=TRADEOFF.get("max_retain_nll_rise", 0.1),
        sweeps=subspace_sweeps(SIZE_METHODS, [RANK]),
    script:
        "../../workflow_scripts/studies/size_study_exp.py"


rule size_study_table:
    # Mean and spread over seeds per width and method, the log-log trend and its extrapolation, figure.
    input:
        rows=[path("size_study_rows", exp=e) for e in SIZE_EXPS],
    output:
        csv=path("table", table="size_study", ext="csv"),
        md=path("table", table="size_study", ext="md"),
        points=path("table", table="size_study_points", ext="csv"),
        trend=path("table", table="size_study_trend", ext="csv"),
        figure=report(
            path("figure", name="size_study"),
            caption="../../report/size_study.rst",
            category="Size study",
        ),
    log:
        log_path("size_study_table"),
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        target=SIZE.get("selectivity_rise", 0.1),
        max_rise=TRADEOFF.get("max_retain_nll_rise", 0.1),
    script:
        "../../workflow_scripts/studies/size_study_table.py"


rule size_study:
    # Target: the size study's table, per-seed points, trend and figure.
    input:
        size_study_targets(),
