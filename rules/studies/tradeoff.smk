# Utility-forgetting trade-off sweeps (`snakemake tradeoff --cores 2`; not in the default target):
# every subspace method at each rank k and scale lambda of `tradeoff`, every optimisation baseline at
# each number of epochs, all evaluated with the track's protocol, and the lambda selection rule
# applied to the held-out slice. Points re-use the factors and forget updates of the main run.


include: "tradeoff_common.smk"


rule tradeoff_erase:
    # One point: W' = W - lambda T~_f (eq. 6 / 16) at rank k and scale lambda, TOFU-evaluated.
    input:
        unpack(tradeoff_erase_inputs),
    output:
        path("tradeoff_erase"),
    log:
        log_path("tradeoff_erase", "exp", "rank", "method", "scale"),
    benchmark:
        benchmark_path("tradeoff_erase", "exp", "rank", "method", "scale")
    wildcard_constraints:
        exp=UNLEARN_EXPS,
        scale=r"\d+(\.\d+)?",
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=tradeoff_evaluate,
        lang=tradeoff_lang,
        group=tradeoff_group,
        stored_scale=lambda wc: erase_scale(wc.exp),
        protocol=TRADEOFF_PROTOCOL,
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/studies/tradeoff_erase.py"


rule tradeoff_baseline:
    # One point: an optimisation baseline trained for {epochs} epochs, TOFU-evaluated.
    input:
        unpack(tradeoff_baseline_inputs),
    output:
        path("tradeoff_baseline"),
    log:
        log_path("tradeoff_baseline", "exp", "method", "epochs"),
    benchmark:
        benchmark_path("tradeoff_baseline", "exp", "method", "epochs")
    wildcard_constraints:
        exp=UNLEARN_EXPS,
        method="|".join(TEXT_BASELINES),
        epochs=r"\d+",
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "tradeoff_baseline",
            model=lambda wc: exp_model(wc.exp),
            evaluate=tradeoff_evaluate,
            lang=tradeoff_lang,
            group=tradeoff_group,
            baseline=baseline_params,
            engine=lambda wc: engine_params(wc.method, wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
            protocol=TRADEOFF_PROTOCOL,
        ),
    shell:
        launch("studies/tradeoff_baseline.py")


rule track_tradeoff:
    # All points of a track, the lambda rule on the held-out slice (TOFU), the figure.
    input:
        points=lambda wc: tradeoff_points(wc.track),
    output:
        csv=path("table", table="{track}_tradeoff", ext="csv"),
        selection=path("tradeoff_selection"),
        selectivity=path("table", table="{track}_selectivity", ext="csv"),
        figure=report(
            path("figure", name="{track}_tradeoff"),
            caption="../../report/tradeoff.rst",
            category="Trade-off",
        ),
    log:
        log_path("tradeoff", "track"),
    wildcard_constraints:
        track="|".join(t.name for t in registry.TRACKS.values() if t.function("sweep")),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        max_rise=TRADEOFF.get("max_retain_nll_rise", 0.1),
        target=config.get("size_study", {}).get("selectivity_rise", 0.1),
        protocol=TRADEOFF_PROTOCOL,
        rank=RANK,
        sweeps=lambda wc: subspace_sweeps(text_track_sweep(wc.track)[1], TRADEOFF_RANKS),
        title=lambda wc: f"{wc.track}: utility vs forgetting, every method's sweep",
    script:
        "../../workflow_scripts/studies/tradeoff_table.py"


rule tradeoff:
    # Target: the trade-off sweeps of every configured track.
    input:
        tradeoff_targets(),
