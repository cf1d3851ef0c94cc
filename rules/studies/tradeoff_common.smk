# Trade-off sweeps: constants and input functions (its rules: rules/studies/tradeoff.smk, which includes this file).
from qrerase.text.tradeoff import scale_name

TRADEOFF = config.get("tradeoff", {})
TRADEOFF_SCALES = [scale_name(s) for s in TRADEOFF.get("scales", [])]
TRADEOFF_RANKS = list(TRADEOFF.get("ranks", [RANK]))
TRADEOFF_EPOCHS = list(TRADEOFF.get("epochs", []))
TRADEOFF_PROTOCOL = TRADEOFF.get("protocol", "full")
# the baselines swept over epochs (tradeoff.baselines; null: every baseline of the track)
_SWEPT = TRADEOFF.get("baselines")
if _SWEPT is not None and not set(_SWEPT) <= set(TEXT_BASELINES):
    raise WorkflowError(
        f"tradeoff.baselines: {sorted(set(_SWEPT) - set(TEXT_BASELINES))} are not text baselines ({TEXT_BASELINES})"
    )
TRADEOFF_BASELINES = list(TEXT_BASELINES if _SWEPT is None else _SWEPT)


def tradeoff_lang(wildcards):
    """The unlearning (= evaluation) language of a point of a track whose points are evaluated in their
    experiment's language (qrerase.tracks.Track.sweep_language: 'xling_hi_R' -> 'hi_R'), else None.
    """
    exp = parse_exp(wildcards.exp)
    return exp.arg if registry.TRACKS[exp.track].sweep_language else None


def tradeoff_group(wildcards):
    """The group of a sweep point in the track's trade-off table: its language (tradeoff_lang), else
    its experiment's track."""
    return tradeoff_lang(wildcards) or parse_exp(wildcards.exp).track


def sweep_eval(wildcards):
    """(evaluation inputs, evaluation settings) of a sweep point: its track's bound `sweep_eval`
    (qrerase.tracks.Track.bind; TOFU: its eval sets, the held-out retain slice and the retain reference;
    cross-lingual: the unlearning language X, so a point is the X -> X pair)."""
    return registry.TRACKS[parse_exp(wildcards.exp).track].function("sweep_eval")(
        wildcards
    )


def tradeoff_eval_inputs(wildcards):
    return sweep_eval(wildcards)[0]


def tradeoff_evaluate(wildcards):
    return sweep_eval(wildcards)[1]


def tradeoff_erase_inputs(wildcards):
    return {
        **erase_inputs(wildcards),
        **tradeoff_eval_inputs(wildcards),
        "model": base_model(wildcards),
    }


def tradeoff_baseline_inputs(wildcards):
    return {**baseline_inputs(wildcards), **tradeoff_eval_inputs(wildcards)}


def subspace_sweeps(methods, ranks):
    """The (method, k) sweeps of the subspace methods among ``methods``; the first one's lambda = 0
    point is the unedited model that every sweep starts from (qrerase.text.tradeoff.share_unedited),
    so only that sweep plans it."""
    return [(m, k) for m in methods if m in DECOMP for k in ranks]


def sweep_scales(sweep, sweeps):
    """The lambdas a (method, k) sweep plans: tradeoff.scales, without 0 after the first sweep."""
    return [s for s in TRADEOFF_SCALES if s != "0" or sweep == sweeps[0]]


def text_track_sweep(track):
    """(experiments, methods) of a text track's sweep: its bound `sweep()` (qrerase.tracks.Track.bind;
    TOFU: exp tofu_<split>; cross-lingual: each xling_X)."""
    return registry.TRACKS[track].function("sweep")()


def tradeoff_points(track):
    """Every sweep point of a text track."""
    exps, methods = text_track_sweep(track)
    sweeps = subspace_sweeps(methods, TRADEOFF_RANKS)
    return [
        *[
            path("tradeoff_erase", exp=e, rank=k, method=m, scale=s)
            for e in exps
            for m, k in sweeps
            for s in sweep_scales((m, k), sweeps)
        ],
        *[
            path("tradeoff_baseline", exp=e, method=m, epochs=n)
            for e in exps
            for m in methods
            if m in TRADEOFF_BASELINES
            for n in TRADEOFF_EPOCHS
        ],
    ]


def text_tradeoff_targets(track):
    """The sweep outputs of a text track (one with a `sweep`): its table, selection, selectivity table
    and figure."""
    return [
        path("table", table=f"{track}_tradeoff", ext="csv"),
        path("tradeoff_selection", track=track),
        path("table", table=f"{track}_selectivity", ext="csv"),
        path("figure", name=f"{track}_tradeoff"),
    ]


def tradeoff_targets():
    """The sweeps of every configured track: its bound `tradeoff_targets()`
    (qrerase.tracks.Track.bind)."""
    return [
        out
        for track in config["tracks"]
        for out in registry.TRACKS[track].function("tradeoff_targets")()
    ]
