# Utility-forgetting trade-off sweeps (`snakemake tradeoff --cores 2`; not in the default target):
# every subspace method at each rank k and scale lambda of `tradeoff`, every optimisation baseline at
# each number of epochs, all evaluated with the track's protocol, and the lambda selection rule
# applied to the held-out retain slice. Points re-use the factors and forget updates of the main run.
from qrerase.tradeoff import scale_name

TRADEOFF = config.get("tradeoff", {})
TRADEOFF_SCALES = [scale_name(s) for s in TRADEOFF.get("scales", [])]
TRADEOFF_RANKS = list(TRADEOFF.get("ranks", [RANK]))
TRADEOFF_EPOCHS = list(TRADEOFF.get("epochs", []))

PATHS.update(
    {
        "tradeoff_erase": "results/{exp}/tradeoff/k{rank}/{method}/lambda{scale}.csv",
        "tradeoff_baseline": "results/{exp}/tradeoff/baselines/{method}_e{epochs}.csv",
        "tradeoff_selection": "results/tables/{track}_tradeoff_selection.csv",
    }
)


def tradeoff_eval_inputs(wildcards):
    """The TOFU evaluation sets, the held-out retain slice and the retain reference's eval log."""
    return {
        **eval_data_inputs(wildcards),
        "tune": path("data", exp=wildcards.exp, name="tune_retain"),
        "reference": path("eval", exp=wildcards.exp, model="retain"),
    }


def tradeoff_erase_inputs(wildcards):
    return {
        **erase_inputs(wildcards),
        **tradeoff_eval_inputs(wildcards),
        "model": base_model(wildcards),
    }


def tradeoff_baseline_inputs(wildcards):
    return {**baseline_inputs(wildcards), **tradeoff_eval_inputs(wildcards)}


def tofu_tradeoff_points():
    subspace = [m for m in METHODS if m in DECOMP]
    baselines = [m for m in METHODS if m in BASELINES]
    return [
        *[
            path("tradeoff_erase", exp=EXP, rank=k, method=m, scale=s)
            for m in subspace
            for k in TRADEOFF_RANKS
            for s in TRADEOFF_SCALES
        ],
        *[
            path("tradeoff_baseline", exp=EXP, method=m, epochs=e)
            for m in baselines
            for e in TRADEOFF_EPOCHS
        ],
    ]


def tradeoff_targets():
    outs = []
    if "tofu" in config["tracks"]:
        outs += [
            path("table", table="tofu_tradeoff", ext="csv"),
            path("tradeoff_selection", track="tofu"),
            path("figure", name="tofu_tradeoff"),
        ]
    return outs


rule tradeoff_erase:
    # One point: W' = W - lambda T~_f (eq. 6 / 16) at rank k and scale lambda, TOFU-evaluated.
    input:
        unpack(tradeoff_erase_inputs),
    output:
        path("tradeoff_erase"),
    log:
        log_path("tradeoff_erase", "exp", "rank", "method", "scale"),
    wildcard_constraints:
        exp=r"tofu_forget\d\d",
        scale=r"\d+(\.\d+)?",
    conda:
        "../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("evaluate"),
    params:
        model=config["model"],
        evaluate=config["tofu"]["evaluate"],
        stored_scale=lambda wc: erase_scale(wc.exp),
        seed=config["seed"],
    script:
        "../workflow_scripts/tradeoff_erase.py"


rule tradeoff_baseline:
    # One point: an optimisation baseline trained for {epochs} epochs, TOFU-evaluated.
    input:
        unpack(tradeoff_baseline_inputs),
    output:
        path("tradeoff_baseline"),
    log:
        log_path("tradeoff_baseline", "exp", "method", "epochs"),
    wildcard_constraints:
        exp=r"tofu_forget\d\d",
        method="|".join(BASELINES),
        epochs=r"\d+",
    conda:
        "../envs/eval.yaml"
    threads: config["threads"]
    resources:
        **resources_for("train"),
    params:
        model=config["model"],
        evaluate=config["tofu"]["evaluate"],
        baseline=baseline_params,
        seed=config["seed"],
    script:
        "../workflow_scripts/tradeoff_baseline.py"


rule tofu_tradeoff:
    # All points, the lambda rule on the held-out retain slice, the utility-Forget Quality figure.
    input:
        points=tofu_tradeoff_points(),
        base=path("metrics", exp=EXP, model="base"),
    output:
        csv=path("table", table="tofu_tradeoff", ext="csv"),
        selection=path("tradeoff_selection", track="tofu"),
        figure=report(
            path("figure", name="tofu_tradeoff"),
            caption="../report/tofu_tradeoff.rst",
            category="TOFU",
        ),
    log:
        log_path("tofu_tradeoff"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        max_rise=TRADEOFF.get("max_retain_nll_rise", 0.1),
        title="TOFU: utility vs forgetting, every method's sweep",
    script:
        "../workflow_scripts/tofu_tradeoff.py"


rule tradeoff:
    # Target: the trade-off sweeps of every configured track.
    input:
        tradeoff_targets(),
