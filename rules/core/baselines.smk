# The shared text baseline rule (TOFU and cross-lingual experiments) and its input functions; the
# settings are the text runner's section (tofu.baselines: qrerase.registry.SETTINGS_SECTIONS).


def refusals_file():
    """Template answers (methods with the 'refusals' input: DPO, FLAT): tofu.baselines.refusals, else
    idontknow.txt next to the TOFU data."""
    given = config["tofu"]["baselines"].get("refusals")
    return (
        given if given else str(Path(config["tofu"]["data"]["root"]) / "idontknow.txt")
    )


def baseline_inputs(wildcards):
    """The fine-tuned model of the experiment's model family, its forget/retain sets (any exp)."""
    inputs = {
        "model": base_model(wildcards),
        "forget": path("data", exp=wildcards.exp, name="forget"),
        "retain": path("data", exp=wildcards.exp, name="retain"),
    }
    if "refusals" in registry.method(wildcards.method).inputs:
        inputs["refusals"] = refusals_file()
    return inputs


def baseline_params(wildcards):
    """qrerase.baselines.text.TextBaselineConfig fields of one method (stage_params: tofu.baselines.<method>
    and the mode, max_length and LoRA shape of `tofu.baselines`); the engine settings come as the rule's
    `engine` param, seed and threads from the job."""
    return stage_params(wildcards.method, wildcards.exp)


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
