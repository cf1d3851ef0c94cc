# Speech track (paper §4.3): speaker-identification unlearning with a speaker classifier
# (the tiny HuBERT, or a checkpoint of a declared architecture: qrerase/tracks/speech/architectures.py).
# Exp "speech" holds the data and the fine-tuned classifier; the shared linear-algebra chain
# (task_matrices -> factors -> energy -> forget_update -> erase_merged) runs unchanged on the
# speech_lora adapters of exps speech_sample / speech_class.


include: "common.smk"


rule speech_data:
    # Read the FSDD WAVs, resample 8 -> 16 kHz, crop/pad, stratified split, both partitions.
    input:
        speech_wavs,
    output:
        audio=path("speech_audio"),
        index=path("speech_index"),
        meta=path("speech_meta"),
    log:
        log_path("speech_data", "exp"),
    wildcard_constraints:
        exp=exp_pattern("speech"),
    conda:
        "../../envs/train.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        data=speech_data_params(),
        seed=config["seed"],
    script:
        "../../workflow_scripts/speech/data.py"


rule speech_pretrain:
    # The embedded encoder's pretraining: FSDD digit recognition (10 classes) over all speakers'
    # training utterances (never the validation or test split). A hub model skips it.
    input:
        **speech_data_inputs(),
    output:
        model=directory(path("speech_pretrained")),
        curve=path("speech_pretrain_curve"),
    log:
        log_path("speech_pretrain", "exp"),
    benchmark:
        benchmark_path("speech_pretrain", "exp")
    wildcard_constraints:
        exp=exp_pattern("speech"),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "speech_pretrain",
            model=config["speech"]["model"],
            train=config["speech"]["pretrain"],
            engine=lambda wc: engine_params("pretrain", wc.exp),
            seed=config["seed"],
        ),
    shell:
        launch("speech/pretrain.py")


rule speech_finetune:
    # The "fine-tuned model": the speaker classifier trained on the training split, from the
    # pretrained encoder (digit-pretrained here, or the hub checkpoint) with a new speaker head.
    input:
        **speech_data_inputs(),
        **speech_pretrained_inputs(),
    output:
        model=directory(path("model", which="full")),
        curve=path("train_curve", which="full"),
    log:
        log_path("speech_finetune", "exp"),
    benchmark:
        benchmark_path("speech_finetune", "exp")
    wildcard_constraints:
        exp=exp_pattern("speech"),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "speech_finetune",
            model=config["speech"]["model"],
            train=config["speech"]["finetune"],
            engine=lambda wc: engine_params("finetune", wc.exp),
            seed=config["seed"],
        ),
    shell:
        launch("speech/finetune.py")


rule speech_lora:
    # LoRA on the attention projections, trained on D_f (train part) or D_r of one setting, from
    # speech.lora.base: the pretrained encoder carrying the fine-tuned speaker head, or the fine-tuned model.
    input:
        unpack(speech_lora_inputs),
        **speech_data_inputs(),
    output:
        adapter=directory(path("lora")),
        curve=path("lora_curve"),
    log:
        log_path("speech_lora", "exp", "set"),
    benchmark:
        benchmark_path("speech_lora", "exp", "set")
    wildcard_constraints:
        exp=SPEECH_EXPS,
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "speech_lora",
            lora=config["speech"]["lora"],
            engine=lambda wc: engine_params("lora", wc.exp),
            model=config["speech"]["model"],
            setting=speech_setting,
            seed=config["seed"],
        ),
    shell:
        launch("speech/lora.py")


rule speech_baseline:
    # Gradient Ascent, SCRUB or Bad Teaching from the fine-tuned model (full or LoRA).
    input:
        **speech_data_inputs(),
        model=base_model,
    output:
        model=directory(path("speech_baseline")),
        curve=path("speech_baseline_curve"),
    log:
        log_path("speech_baseline", "exp", "method"),
    benchmark:
        benchmark_path("speech_baseline", "exp", "method")
    wildcard_constraints:
        exp=SPEECH_EXPS,
        method="|".join(SPEECH_BASELINES),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "speech_baseline",
            cfg=speech_baseline_params,
            engine=lambda wc: engine_params(wc.method, wc.exp),
            setting=speech_setting,
            seed=config["seed"],
        ),
    shell:
        launch("speech/baseline.py")


rule speech_evaluate:
    # Top-k speaker accuracy of one model on D_t, D_f and D_r of one setting; the LOSS attack's AUC
    # on D_f's training clips vs the same speakers' held-out clips (qrerase.tracks.speech.privacy).
    input:
        **speech_data_inputs(),
        model=speech_checkpoint,
    output:
        accuracy=path("speech_eval"),
        mia=path("speech_mia"),
    log:
        log_path("speech_evaluate", "exp", "model"),
    wildcard_constraints:
        exp=SPEECH_EXPS,
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        setting=speech_setting,
        top_k=config["speech"]["top_k"],
        batch_size=config["speech"]["evaluate"]["batch_size"],
        model=config["speech"]["model"],
        seed=config["seed"],
    script:
        "../../workflow_scripts/speech/evaluate.py"


rule speech_table:
    # The paper's speech table: method rows; D_t, D_f, D_r under Sample and Class.
    input:
        evals=[
            path("speech_eval", exp=speech_exp(s), model=m)
            for s in SPEECH_SETTINGS
            for m in speech_models()
        ],
    output:
        **{
            ext: report(
                path("table", table="speech", ext=ext),
                caption="table.rst",
                category="Speech",
                subcategory="Tables",
                labels={"table": "speech", "format": ext},
            )
            for ext in ("csv", "md", "tex")
        },
    log:
        log_path("speech_table"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        settings=SPEECH_SETTINGS,
        models=speech_models(),
        top_k=config["speech"]["top_k"],
        rank=SPEECH_RANK,
    script:
        "../../workflow_scripts/speech/table.py"


rule speech_mia_table:
    # Membership inference per setting: the LOSS attack's AUC of every table model (ideal 0.5).
    input:
        mia=[
            path("speech_mia", exp=speech_exp(s), model=m)
            for s in SPEECH_SETTINGS
            for m in speech_models()
        ],
    output:
        **{
            ext: report(
                path("table", table="speech_mia", ext=ext),
                caption="mia_table.rst",
                category="Speech",
                subcategory="Tables",
                labels={"table": "speech_mia", "format": ext},
            )
            for ext in ("csv", "md")
        },
    log:
        log_path("speech_mia_table"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        settings=SPEECH_SETTINGS,
        models=speech_models(),
    script:
        "../../workflow_scripts/speech/mia_table.py"


rule speech_energy:
    # Eq. 14 energies of both settings side by side, and how concentrated each one is.
    input:
        energy=[path("energy", exp=speech_exp(s)) for s in SPEECH_SETTINGS],
    output:
        figure=report(
            path("figure", name="speech_energy"),
            caption="energy.rst",
            category="Speech",
            subcategory="Figures",
            labels={"figure": "energy per setting"},
        ),
        csv=path("table", table="speech_energy", ext="csv"),
        md=path("table", table="speech_energy", ext="md"),
    log:
        log_path("speech_energy"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        settings=SPEECH_SETTINGS,
    script:
        "../../workflow_scripts/speech/energy.py"


rule speech_rank:
    # Rank k vs reconstruction error of T_f (top) and D_f / D_r accuracy (bottom), CPQR and SVD.
    input:
        reports=[
            path("factor_report", exp=speech_exp(s), rank=k)
            for s in SPEECH_RANK_SETTINGS
            for k in SPEECH_RANKS
        ],
        evals=[
            path("speech_eval", exp=speech_exp(s), model=format_model(m, k))
            for s in SPEECH_RANK_SETTINGS
            for k in SPEECH_RANKS
            for _, m in registry.RANK_PAIRS
        ],
        base=[
            path("speech_eval", exp=speech_exp(s), model="base")
            for s in SPEECH_RANK_SETTINGS
        ],
    output:
        figure=report(
            path("figure", name="speech_rank"),
            caption="rank.rst",
            category="Speech",
            subcategory="Figures",
            labels={"figure": "rank"},
        ),
        csv=path("table", table="speech_rank", ext="csv"),
    log:
        log_path("speech_rank"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        settings=SPEECH_RANK_SETTINGS,
        ranks=SPEECH_RANKS,
        selected_rank=SPEECH_RANK,
    script:
        "../../workflow_scripts/speech/rank.py"


rule speech_tradeoff_subspace:
    # One subspace method at every (k, lambda) of speech.tradeoff, erased in-process from the
    # lambda-free factors; D_t, D_f, D_r and the held-out slice D_v of each point.
    input:
        unpack(speech_tradeoff_factor_inputs),
        **speech_data_inputs(),
        model=base_model,
    output:
        path("speech_tradeoff_points"),
    log:
        log_path("speech_tradeoff_subspace", "exp", "method"),
    benchmark:
        benchmark_path("speech_tradeoff_subspace", "exp", "method")
    wildcard_constraints:
        exp=SPEECH_EXPS,
        method="|".join(DECOMP),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        setting=speech_setting,
        ranks=sorted(SPEECH_TRADEOFF["ranks"]),
        scales=list(SPEECH_TRADEOFF["scales"]),
        retain_rank=config["unlearn"]["retain_rank"],
        top_k=config["speech"]["top_k"],
        batch_size=config["speech"]["evaluate"]["batch_size"],
        seed=config["seed"],
    script:
        "../../workflow_scripts/speech/tradeoff_subspace.py"


rule speech_tradeoff_baseline:
    # One baseline at every value of its knob (epochs or lr), or the fine-tuned reference ('base').
    input:
        unpack(speech_tradeoff_baseline_inputs),
        **speech_data_inputs(),
        model=base_model,
    output:
        path("speech_tradeoff_points"),
    log:
        log_path("speech_tradeoff_baseline", "exp", "method"),
    benchmark:
        benchmark_path("speech_tradeoff_baseline", "exp", "method")
    wildcard_constraints:
        exp=SPEECH_EXPS,
        method="|".join(["base", *SPEECH_BASELINES]),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "speech_tradeoff_baseline",
            cfg=lambda wc: {} if wc.method == "base" else speech_baseline_params(wc),
            engine=lambda wc: (
                {} if wc.method == "base" else engine_params(wc.method, wc.exp)
            ),
            sweep=speech_tradeoff_sweep,
            setting=speech_setting,
            top_k=config["speech"]["top_k"],
            batch_size=config["speech"]["evaluate"]["batch_size"],
            seed=config["seed"],
        ),
    shell:
        launch("speech/tradeoff_baseline.py")


rule speech_tradeoff:
    # D_r against D_f per method and setting (table + figure), and the lambda rule on D_v.
    input:
        points=[
            path("speech_tradeoff_points", exp=speech_exp(s), method=m)
            for s in SPEECH_TRADEOFF_SETTINGS
            for m in ["base", *speech_tradeoff_methods()]
        ],
    output:
        csv=path("table", table="speech_tradeoff", ext="csv"),
        rule_csv=path("table", table="speech_scale_rule", ext="csv"),
        figure=report(
            path("figure", name="speech_tradeoff"),
            caption="tradeoff.rst",
            category="Speech",
            subcategory="Figures",
            labels={"figure": "trade-off"},
        ),
    log:
        log_path("speech_tradeoff"),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        rank=SPEECH_RANK,
        rule_methods=[m for m in SPEECH_METHODS if m in DECOMP],
        max_drop=SPEECH_TRADEOFF["max_drop"],
    script:
        "../../workflow_scripts/speech/tradeoff.py"


rule speech_tradeoff_all:
    input:
        speech_tradeoff_targets(),


rule robustness_speech:
    # Every attack of the robustness stage (docs/robustness.md) on one classifier of a setting:
    # relearning on half A of D_f and benign fine-tuning on D_r (full, LoRA; each budget and lr
    # factor), GGUF quantization; the subspace diagnostic of the update. Tables: rule robustness_table.
    # The floor (model 'retain') is trained in its job: speech_finetune's recipe on D_r.
    input:
        unpack(speech_robustness_inputs),
    output:
        rows="results/{exp}/robustness/{model}.csv",
        subspace="results/{exp}/robustness/{model}_subspace.csv",
    log:
        log_path("robustness_speech", "exp", "model"),
    wildcard_constraints:
        exp=SPEECH_EXPS,
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),  # it trains: the attacks, and the floor from the pretrained encoder
    params:
        job=speech_robustness_params,
        model=config["speech"]["model"],
        settings=lambda wc: ROBUSTNESS_JOB,  # rules/studies/robustness_common.smk: the attack settings only
        seed=config["seed"],
        threads=config["threads"],
    script:
        "../../workflow_scripts/speech/robustness.py"
