# TOFU track: per-model metrics, the TOFU tables, and the track's default targets.
def eval_models():
    """Model names evaluated in the TOFU table: base, retain reference, each method (subspace
    methods at rank k: '<method>_k<rank>'; optimisation baselines by their name, e.g. 'npo').
    """
    return (
        ["base", "retain"]
        + [m if m in BASELINES else f"{m}_k{RANK}" for m in TOFU_METHODS]
        + [f"{m}_k{RANK}" for m in CONTROLS]
    )


def imported_models():
    return {m["name"]: m for m in config["tofu"].get("imported_models", [])}


def metrics_inputs(wildcards):
    """A model's eval log and the retain reference's (none for the reference itself)."""
    local_ref = path("eval", exp=wildcards.exp, model="retain")
    item = imported_models().get(wildcards.model)
    if item is not None:
        return {"log": item["log"], "reference": item.get("reference") or local_ref}
    inputs = {"log": path("eval", exp=wildcards.exp, model=wildcards.model)}
    if wildcards.model != "retain":
        inputs["reference"] = local_ref
    return inputs


def metrics_name(wildcards):
    return row_key(wildcards.model)


def erase_targets():
    outs = []
    for method in [m for m in TOFU_METHODS if m in DECOMP]:
        if "adapter" in config["erase"]["outputs"]:
            outs.append(path("erase_adapter", exp=EXP, rank=RANK, method=method))
        if "merged" in config["erase"]["outputs"]:
            outs.append(path("erased_model", exp=EXP, rank=RANK, method=method))
    return outs


def tofu_targets():
    """The TOFU track's default targets: tables, figures, erase outputs, baseline curves, cost table."""
    return [
        *expand(PATHS["table"], table="tofu", ext=["csv", "md", "tex"]),
        *expand(PATHS["table"], table="tofu_wide", ext=["csv", "md", "tex"]),
        path("figure", name="tofu_truth_ratio"),
        path("energy_fig", exp=EXP),
        path("factor_report", exp=EXP, rank=RANK),
        *erase_targets(),
        *[path("baseline_curve", exp=EXP, method=m) for m in TOFU_BASELINES],
        *cost_targets("tofu"),
    ]


rule tofu_metrics:
    # Per model: Probability, ROUGE-L, Truth Ratio per set, Model Utility, Forget Quality (tidy CSV).
    input:
        unpack(metrics_inputs),
    output:
        path("metrics"),
    log:
        log_path("tofu_metrics", "exp", "model"),
    conda:
        "../envs/eval.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        name=metrics_name,
    script:
        "../workflow_scripts/tofu_metrics.py"


rule tofu_table:
    # The paper's TOFU table: Model Utility and Forget Quality (KS p-value vs the retain reference).
    input:
        metrics=[
            path("metrics", exp=EXP, model=m)
            for m in [*eval_models(), *imported_models()]
        ],
        logs=[path("eval", exp=EXP, model=m) for m in eval_models()],
    output:
        **{
            f"{table}_{ext}": report(
                path("table", table=table, ext=ext),
                caption=f"../report/{table}_table.rst",
                category="TOFU",
                subcategory="Tables",
                labels={"table": table, "format": ext},
            )
            for table in ("tofu", "tofu_wide")
            for ext in ("csv", "md", "tex")
        },
        truth_ratio=report(
            path("figure", name="tofu_truth_ratio"),
            caption="../report/truth_ratio.rst",
            category="TOFU",
            subcategory="Figures",
            labels={"figure": "truth ratio"},
        ),
    log:
        log_path("tofu_table"),
    conda:
        "../envs/tables.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        rows=[row_key(m) for m in eval_models()],
        reference="retain",
        imported={n: m.get("label", n) for n, m in imported_models().items()},
        controls=CONTROLS,
        rank=RANK,
    script:
        "../workflow_scripts/tofu_table.py"
