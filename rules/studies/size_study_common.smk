# Size study: constants and input functions (its rules: rules/studies/size_study.smk, which includes this file).
# An experiment size_h<W>_s<S> runs the TOFU track's rules with the embedded model at hidden width W
# and seed S (qrerase.workflow.naming); the recipe of every width is qrerase.text.size_study's.
from qrerase.text.size_study import scaled_lr, size_model
from qrerase.workflow.naming import size_exp

SIZE = config.get("size_study") or {}
SIZE_METHODS = list(SIZE.get("methods", []))
_WIDE = SIZE.get("wide_seeds")
if _WIDE and not set(_WIDE["seeds"]) <= set(SIZE.get("seeds", [])):
    raise WorkflowError(
        f"size_study.wide_seeds.seeds: {_WIDE['seeds']} must be a subset of size_study.seeds "
        f"({SIZE.get('seeds', [])})"
    )


def size_seeds(width):
    """The seeds a width runs: size_study.seeds, or wide_seeds.seeds from wide_seeds.min_width on."""
    if _WIDE and width >= _WIDE["min_width"]:
        return [s for s in SIZE["seeds"] if s in _WIDE["seeds"]]
    return list(SIZE.get("seeds", []))


SIZE_EXPS = [size_exp(w, s) for w in SIZE.get("widths", []) for s in size_seeds(w)]
_unknown = [m for m in SIZE_METHODS if m not in DECOMP and m not in TEXT_BASELINES]
if _unknown:
    raise WorkflowError(
        f"size_study.methods: {_unknown} are neither subspace methods ({list(DECOMP)}) "
        f"nor text baselines ({TEXT_BASELINES})"
    )
# The widths are checked at planning time for the embedded model; with a hub model (name_or_path set)
# only a run that asks for a size_h<W>_s<S> target fails, in exp_model, naming model.name_or_path.
try:
    if config["model"].get("name_or_path") is None:
        for _w in SIZE.get("widths", []):
            size_model(config["model"], _w, SIZE["intermediate_ratio"])
except ValueError as exc:
    raise WorkflowError(str(exc)) from None


def exp_model(exp):
    """The `model` section an experiment's jobs build and load with: the config's, or for a size
    study experiment (size_h<W>_s<S>) the embedded model at width W (size_study.intermediate_ratio).
    """
    size = size_of(exp)
    if size is None:
        return config["model"]
    ratio = config["size_study"]["intermediate_ratio"]
    return size_model(config["model"], size[0], ratio)


def exp_seed(exp):
    """The seed of an experiment's jobs: `seed`, or S of a size study experiment size_h<W>_s<S>."""
    size = size_of(exp)
    return config["seed"] if size is None else size[1]


def size_lr(lr, exp):
    """A size study experiment's learning rate: lr (W_ref / W)^alpha (size_study.lr_exponent)."""
    study = config["size_study"]
    return scaled_lr(
        lr, size_of(exp)[0], study["reference_width"], study["lr_exponent"]
    )


def size_points(wildcards):
    """Every trade-off point of one size-study experiment: each subspace method of size_study.methods
    at rank unlearn.rank and each lambda of tradeoff.scales (which needs 0, the unedited model), each
    baseline at each of tradeoff.epochs."""
    if "0" not in TRADEOFF_SCALES:
        raise WorkflowError(
            "size_study: tradeoff.scales must contain 0 (the unedited model the rises are measured from)"
        )
    exp = wildcards.exp
    sweeps = subspace_sweeps(SIZE_METHODS, [RANK])
    return [
        *[
            path("tradeoff_erase", exp=exp, rank=k, method=m, scale=s)
            for m, k in sweeps
            for s in sweep_scales((m, k), sweeps)
        ],
        *[
            path("tradeoff_baseline", exp=exp, method=m, epochs=n)
            for m in SIZE_METHODS
            if m in TEXT_BASELINES
            for n in TRADEOFF_EPOCHS
        ],
    ]


def size_exp_inputs(wildcards):
    """One size-study experiment's sweep points, layer energies, fine-tuned model (for its parameter
    count), the forget / retain SVD factors at rank k (for the principal angles) and the eval folders
    of the fine-tuned model and the retain reference (sequence_metrics.json: the attack AUCs).
    """
    exp = wildcards.exp
    return {
        "points": size_points(wildcards),
        "sequence": [path("eval", exp=exp, model=m) for m in ("base", "retain")],
        "energy": path("energy", exp=exp),
        "model": path("model", exp=exp, which="full"),
        "forget": path("factors", exp=exp, rank=RANK, decomp="svd", set="forget"),
        "retain": path("factors", exp=exp, rank=RANK, decomp="svd", set="retain"),
    }


def size_study_targets():
    """The size study's outputs (`snakemake size_study`; not in the default target)."""
    return [
        *expand(PATHS["table"], table="size_study", ext=["csv", "md"]),
        path("table", table="size_study_points", ext="csv"),
        path("table", table="size_study_trend", ext="csv"),
        path("figure", name="size_study"),
    ]
