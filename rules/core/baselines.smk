# The shared text baseline rule (TOFU and cross-lingual experiments); its input functions are in
# rules/core/common.smk.


rule baseline:
    # Optimisation baselines (GA, GradDiff, KL, NPO, DPO, FLAT): unlearn by training the fine-tuned model.
    input:
        unpack(baseline_inputs),
    output:
        model=directory(path("baseline_model")),
        curve=path("baseline_curve"),
    log:
        log_path("baseline", "exp", "method"),
    benchmark:
        benchmark_path("baseline", "exp", "method")
    wildcard_constraints:
        exp=UNLEARN_EXPS,
        method="|".join(TEXT_BASELINES),
    conda:
        "../../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        **launch_params(
            "baseline",
            model=lambda wc: exp_model(wc.exp),
            baseline=baseline_params,
            engine=lambda wc: engine_params(wc.method, wc.exp),
            seed=lambda wc: exp_seed(wc.exp),
        ),
    shell:
        launch("core/baseline.py")
