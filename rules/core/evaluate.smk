rule evaluate:
    # TOFU protocol: answer-token losses (gt, paraphrased, perturbed) and greedy ROUGE-L per question;
    # the per-answer MIA / memorisation statistics of the forget and holdout sets (sequence_metrics.json).
    input:
        unpack(eval_model_inputs),
        unpack(eval_data_inputs),
        holdout=lambda wc: path("data", exp=wc.exp, name="eval_holdout"),
    output:
        directory(path("eval")),
    log:
        log_path("evaluate", "exp", "model"),
    conda:
        "../../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=lambda wc: exp_model(wc.exp),
        evaluate=config["tofu"]["evaluate"],
        seed=lambda wc: exp_seed(wc.exp),
    script:
        "../../workflow_scripts/core/evaluate.py"
