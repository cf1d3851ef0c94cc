# Optimisation baselines of the text tracks (tofu, crosslingual): qrerase.baselines.text.
TOFU_BASELINES = [m for m in TOFU_METHODS if m in BASELINES]


def refusals_file():
    """DPO / FLAT template answers: baselines.refusals, else idontknow.txt next to the TOFU data."""
    given = config["baselines"].get("refusals")
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
    if wildcards.method in ("dpo", "flat"):
        inputs["refusals"] = refusals_file()
    return inputs


def baseline_params(wildcards):
    """qrerase.baselines.text.BaselineConfig fields of one method (seed and threads added by the job)."""
    bl = config["baselines"]
    lora = bl["lora"]
    return {
        "method": wildcards.method,
        **bl[wildcards.method],
        "mode": bl["mode"],
        "max_length": bl["max_length"],
        "lora_r": lora["r"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora.get("dropout", 0.0),
        "lora_target_modules": list(lora["target_modules"]),
    }


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
        method="|".join(BASELINES),
    conda:
        "../envs/train.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        baseline=baseline_params,
        seed=config["seed"],
    script:
        "../workflow_scripts/baseline.py"
