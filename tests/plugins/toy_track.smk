# The toy track's rules (tests/plugins/toy_track.py, Track.rules): included by the Snakefile after the
# built-in rules, so path(), config and the built-in functions are defined. Its target, cost and
# trade-off functions are bound to its Track at the end (Track.bind).
import toy_track


def toy_count_targets():
    """The toy track's default targets: its table."""
    return [path("table", table="toy_count", ext="csv")]


def toy_count_costs():
    """No cost groups: the toy track trains nothing."""
    return {}


def toy_count_tradeoff_targets():
    """No trade-off sweep."""
    return []


rule toy_count_table:
    input:
        toy_track.source(config),
    output:
        path("table", table="toy_count", ext="csv"),
    params:
        unit=config.get("toy_count", {}).get("unit", "words"),
    run:
        toy_track.count_table(input[0], output[0], params.unit)


# the functions the generic rules call for this track (qrerase.tracks.Track.bind)
registry.TRACKS["toy_count"].bind(
    targets=toy_count_targets,
    costs=toy_count_costs,
    tradeoff_targets=toy_count_tradeoff_targets,
)
