# The robustness stage (docs/robustness.md): every attack on one model per job, then per track its
# tables and figures; `snakemake robustness` builds every configured track's tables, the default target
# those of robustness.in_default_target. Input functions: rules/studies/robustness_common.smk.


rule robustness_halves:
    # The seeded A/B split of a text experiment's forget set within each entity (docs/robustness.md#protocol):
    # A.jsonl (the relearning data), B.jsonl (scored), B_<lang>.jsonl (B's questions in each other language);
    # each row with its entity and, from the plan's `paraphrases` file, its paraphrased question.
    input:
        unpack(
            lambda wc: {
                k: v
                for k, v in _plan_of(wc.exp)["data"](wc.exp).items()
                if k.startswith("forget") or k == "paraphrases"
            }
        ),
    output:
        directory("results/{exp}/robustness/halves"),
    log:
        log_path("robustness_halves", "exp"),
    wildcard_constraints:
        exp=TEXT_EXPS,
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        block=lambda wc: _plan_of(wc.exp)["block"],
        languages=lambda wc: _plan_of(wc.exp)["languages"](wc.exp),
        seed=config["seed"],
        a_share=robustness_settings(ROBUSTNESS).a_share,
    script:
        "../../workflow_scripts/studies/robustness_halves.py"


rule robustness_text:
    # Every attack on one text model: relearning on half A (full, LoRA; each budget and lr factor),
    # benign fine-tuning on the retain set, GGUF quantization; the subspace diagnostic of the update.
    input:
        unpack(robustness_inputs),
    output:
        rows="results/{exp}/robustness/{model}.csv",
        subspace="results/{exp}/robustness/{model}_subspace.csv",
    log:
        log_path("robustness_text", "exp", "model"),
    wildcard_constraints:
        exp=TEXT_EXPS,
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        job=robustness_params,
        model=config["model"],
        settings=ROBUSTNESS_JOB,
        seed=config["seed"],
        threads=config["threads"],
    script:
        "../../workflow_scripts/studies/robustness_text.py"


rule robustness_table:
    # A track's robustness tables (recovery per model, attack and budget; the subspace diagnostic) and figures.
    input:
        unpack(robustness_table_inputs),
    output:
        **robustness_table_outputs(""),
    log:
        log_path("robustness_table", "track"),
    wildcard_constraints:
        track="|".join(registry.TRACKS),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        plan=robustness_table_params,
    script:
        "../../workflow_scripts/studies/robustness_table.py"


rule robustness_rule_table:
    # The same tables for each subspace method at the lambda its track's lambda rule picks (comparable forgetting).
    input:
        unpack(lambda wc: robustness_table_inputs(wc, RULE)),
    output:
        **robustness_table_outputs(RULE),
    log:
        log_path("robustness_rule_table", "track"),
    wildcard_constraints:
        track="|".join(registry.TRACKS),
    conda:
        "../../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        plan=lambda wc: robustness_table_params(wc, RULE),
    script:
        "../../workflow_scripts/studies/robustness_table.py"


rule robustness:
    # `snakemake robustness --cores 2`: every configured track's robustness tables and figures.
    input:
        robustness_targets(),
