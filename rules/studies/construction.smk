# The construction study of the paper's task vectors (docs/real-model.md, "The construction study"):
# `snakemake construction --cores 2 --configfile config/smollm2-135m.yaml`. On a text track's sweep
# experiment's fine-tuned model (config/smollm2-135m.yaml: TOFU's) it varies the checkpoint the two task adapters learn from (construction.starts), the
# retain projector of eq. 3 (construction.projectors: k or full), k (construction.ranks) and lambda on a
# doubling grid that stops past a held-out bound (construction.scales, construction.stop_rise).
# Adapters from the fine-tuned model are the main run's (rule lora); only another start trains new
# ones. The library side: qrerase.text.construction.


include: "construction_common.smk"


rule construction_lora:
    # A task adapter of the study trained from another checkpoint than the fine-tuned model, with the
    # `lora` recipe of rule lora.
    input:
        unpack(construction_start_inputs),
        data=path("data", name="{set}"),
    output:
        adapter=directory(path("construction_lora")),
        curve=path("construction_lora_curve"),
    log:
        log_path("construction_lora", "exp", "start", "set"),
    benchmark:
        benchmark_path("construction_lora", "exp", "start", "set")
    wildcard_constraints:
        exp=UNLEARN_EXPS,
        start="pretrained",
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "lora",
            model=lambda wc: exp_model(wc.exp),
            lora=lambda wc: {**exp_section("lora", wc.exp), "base": wc.start},
            engine=lambda wc: engine_params("lora", wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
        ),
    shell:
        launch("core/train_lora.py")


rule construction_effect:
    # Each adapter of a start on its own checkpoint: the forget and retain training sets' answer NLL
    # without and with it (how far its training moved them).
    input:
        unpack(construction_effect_inputs),
    output:
        path("construction_effect"),
    log:
        log_path("construction_effect", "exp", "start"),
    benchmark:
        benchmark_path("construction_effect", "exp", "start")
    wildcard_constraints:
        **_STUDY_CONSTRAINTS,
        exp=UNLEARN_EXPS,
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=tradeoff_evaluate,
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/studies/construction_effect.py"


rule construction_unedited:
    # The fine-tuned model's answer NLLs on the sweep's sets: the lambda = 0 point of every sweep.
    input:
        unpack(construction_eval_inputs),
        model=base_model,
    output:
        path("construction_unedited"),
    log:
        log_path("construction_unedited", "exp"),
    benchmark:
        benchmark_path("construction_unedited", "exp")
    wildcard_constraints:
        exp=UNLEARN_EXPS,
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=tradeoff_evaluate,
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/studies/construction_sweep.py"


rule construction_sweep:
    # One variant: T~_f at lambda = 1 from the start's adapters (eqs. 3-5 under the projector; eq. 16's
    # layers for an LL method), then W' = W - lambda T~_f at each lambda of the doubling grid until the
    # held-out retain NLL has risen by more than construction.stop_rise; per module, the quantities that
    # explain the edit's size.
    input:
        unpack(construction_sweep_inputs),
    output:
        points=path("construction_sweep"),
        modules=path("construction_modules"),
    log:
        log_path("construction_sweep", "exp", "start", "projector", "rank", "method"),
    benchmark:
        benchmark_path(
            "construction_sweep", "exp", "start", "projector", "rank", "method"
        )
    wildcard_constraints:
        **_STUDY_CONSTRAINTS,
        exp=UNLEARN_EXPS,
        method="|".join(DECOMP),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=tradeoff_evaluate,
        decomp=lambda wc: DECOMP[wc.method],
        localised=lambda wc: registry.is_localised(wc.method),
        granularity=config["unlearn"]["energy_granularity"],
        scales=CONSTRUCTION.get("scales"),
        stop_rise=CONSTRUCTION.get("stop_rise"),
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/studies/construction_sweep.py"


rule construction_pick:
    # One variant's TOFU-protocol point at its lambda rule's pick (tradeoff.max_retain_nll_rise on the
    # held-out slice, read from its sweep alone).
    input:
        unpack(construction_sweep_inputs),
        unpack(tradeoff_eval_inputs),  # every eval set, the held-out slice, the reference
        points=path("construction_sweep"),
    output:
        path("construction_pick"),
    log:
        log_path("construction_pick", "exp", "start", "projector", "rank", "method"),
    benchmark:
        benchmark_path(
            "construction_pick", "exp", "start", "projector", "rank", "method"
        )
    wildcard_constraints:
        **_STUDY_CONSTRAINTS,
        exp=UNLEARN_EXPS,
        method="|".join(DECOMP),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=tradeoff_evaluate,
        decomp=lambda wc: DECOMP[wc.method],
        localised=lambda wc: registry.is_localised(wc.method),
        granularity=config["unlearn"]["energy_granularity"],
        max_rise=config.get("tradeoff", {}).get("max_retain_nll_rise"),
        group=tradeoff_group,
        lang=tradeoff_lang,
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/studies/construction_pick.py"


rule construction_baseline:
    # An optimisation baseline trained for {epochs} epochs, TOFU-protocol evaluated (rule
    # tradeoff_baseline's job at protocol full).
    input:
        unpack(tradeoff_baseline_inputs),
    output:
        path("construction_baseline"),
    log:
        log_path("construction_baseline", "exp", "method", "epochs"),
    benchmark:
        benchmark_path("construction_baseline", "exp", "method", "epochs")
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
            protocol="full",
        ),
    shell:
        launch("studies/tradeoff_baseline.py")


rule construction_tables:
    # The construction table (per variant: its lambda rule's pick, the rises there, the TOFU-protocol
    # point), the explaining quantities per adapter and module, and the frontier figure.
    input:
        unpack(construction_tables_inputs),
    output:
        csv=path("table", table="{track}_construction", ext="csv"),
        md=path("table", table="{track}_construction", ext="md"),
        modules=path("table", table="{track}_construction_modules", ext="csv"),
        figure=path("figure", name="{track}_construction"),
    log:
        log_path("construction_tables", "track"),
    wildcard_constraints:
        track="|".join(config["tracks"]),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        max_rise=config.get("tradeoff", {}).get("max_retain_nll_rise"),
    script:
        "../../workflow_scripts/studies/construction_tables.py"


rule construction:
    # Target: the construction study's tables and figure (planning refuses a config without the section).
    input:
        lambda wc: construction_targets(),
