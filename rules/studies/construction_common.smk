# The construction study: constants and input functions (its rules: rules/studies/construction.smk, which includes this file).
# It runs on every configured text track whose trade-off sweep has a held-out slice (rules/studies/tradeoff_common.smk:
# sweep_eval), on that track's sweep experiments.
from qrerase.text.construction import PROJECTORS, STARTS, check_construction

CONSTRUCTION = config.get("construction") or {}


class _Wildcards(dict):
    """Wildcards of a planned job (attribute and ``get`` access), for an input function called at planning."""

    __getattr__ = dict.__getitem__


def construction_tracks():
    """The configured tracks the study runs on: those with a sweep whose points read a held-out slice."""
    return [
        t
        for t in config["tracks"]
        if registry.TRACKS[t].function("sweep") is not None
        and "tune" in sweep_eval(_Wildcards(exp=text_track_sweep(t)[0][0]))[0]
    ]


def construction_variants():
    """(start, projector, k, method) of every planned sweep. A full projector at k >= lora.r is the
    k projector (P_r has every column of Q_r either way), so it is planned once, as 'k'.
    """
    r = config["lora"]["r"]
    return [
        (start, projector, k, method)
        for start in CONSTRUCTION["starts"]
        for k in CONSTRUCTION["ranks"]
        for projector in CONSTRUCTION["projectors"]
        if not (projector == "full" and k >= r and "k" in CONSTRUCTION["projectors"])
        for method in CONSTRUCTION["methods"]
    ]


def construction_adapter(exp, start, which):
    """A task adapter of the study: the main run's (rule lora) for the finetuned start, else rule
    construction_lora's."""
    if start == "finetuned":
        return adapter_dir_of(exp, which)
    return path("construction_lora", exp=exp, start=start, set=which)


def construction_start_inputs(wildcards):
    """The checkpoint a study adapter learns from: the pretrained one (rule pretrain's, or the imported
    GGUF); a hub model's is loaded by name (no input)."""
    if tiny_model():
        return {
            "model": path("model", exp=model_exp(wildcards.exp), which="pretrained")
        }
    if GGUF_FILE:
        return {"model": imported_model(wildcards.exp)}
    return {}


def construction_eval_inputs(wildcards):
    """The sets a sweep point reads: the forget and retain evaluation sets and the held-out slice."""
    inputs = tradeoff_eval_inputs(wildcards)
    return {k: inputs[k] for k in ("eval_forget", "eval_retain", "tune")}


def construction_sweep_inputs(wildcards):
    return {
        **construction_eval_inputs(wildcards),
        "model": base_model(wildcards),
        "forget_adapter": construction_adapter(
            wildcards.exp, wildcards.start, "forget"
        ),
        "retain_adapter": construction_adapter(
            wildcards.exp, wildcards.start, "retain"
        ),
        "unedited": path("construction_unedited", exp=wildcards.exp),
    }


def construction_effect_inputs(wildcards):
    """A start's checkpoint (the fine-tuned model, or construction_start_inputs), its two adapters
    and their training sets."""
    start = (
        {"model": base_model(wildcards)}
        if wildcards.start == "finetuned"
        else construction_start_inputs(wildcards)
    )
    return {
        **start,
        "forget_adapter": construction_adapter(
            wildcards.exp, wildcards.start, "forget"
        ),
        "retain_adapter": construction_adapter(
            wildcards.exp, wildcards.start, "retain"
        ),
        "forget": path("data", exp=wildcards.exp, name="forget"),
        "retain": path("data", exp=wildcards.exp, name="retain"),
    }


def construction_targets():
    """The study's outputs per track (`snakemake construction`; not in the default target)."""
    if not CONSTRUCTION:
        raise WorkflowError(
            "snakemake construction: the config has no `construction` section (config/smollm2-135m.yaml has one)"
        )
    tracks = construction_tracks()
    try:
        check_construction(config, TEXT_BASELINES, list(DECOMP), tracks)
    except ValueError as exc:
        raise WorkflowError(str(exc)) from None
    return [
        out
        for track in tracks
        for out in (
            path("table", table=f"{track}_construction", ext="csv"),
            path("table", table=f"{track}_construction", ext="md"),
            path("table", table=f"{track}_construction_modules", ext="csv"),
            path("figure", name=f"{track}_construction"),
        )
    ]


def construction_tables_inputs(wildcards):
    """Every artifact of a track's study (its sweep experiment), and the main run's baseline sweep,
    baseline metrics and unedited metrics."""
    (exp,) = text_track_sweep(wildcards.track)[0][:1]
    fields = ("start", "projector", "rank", "method")
    variants = [dict(zip(fields, v)) for v in construction_variants()]
    baselines = CONSTRUCTION["baselines"]
    return {
        "sweeps": [path("construction_sweep", exp=exp, **v) for v in variants],
        "modules": [path("construction_modules", exp=exp, **v) for v in variants],
        "picks": [
            path("construction_pick", exp=exp, **v)
            for v in variants
            if v["rank"] in CONSTRUCTION["protocol_ranks"]
        ],
        "effects": [
            path("construction_effect", exp=exp, start=s)
            for s in CONSTRUCTION["starts"]
        ],
        "baselines": [
            path("construction_baseline", exp=exp, method=m, epochs=e)
            for m in baselines
            for e in CONSTRUCTION["epochs"]
        ],
        "baseline_sweep": [
            path("tradeoff_baseline", exp=exp, method=m, epochs=e)
            for m in baselines
            for e in TRADEOFF_EPOCHS
        ],
        "baseline_metrics": [path("metrics", exp=exp, model=m) for m in baselines],
        "unedited": path("construction_unedited", exp=exp),
        "base_metrics": path("metrics", exp=exp, model="base"),
    }


_STUDY_CONSTRAINTS = {
    "start": "|".join(STARTS),
    "projector": "|".join(PROJECTORS),
}
