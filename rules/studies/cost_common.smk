# Cost tables: constants and input functions (its rules: rules/studies/cost.smk, which includes this file).
#: track -> header of its cost table's column groups (None: one group, the track's one experiment;
#: qrerase.tracks.Track.cost_group_header).
COST_GROUP_HEADER = {t.name: t.cost_group_header for t in registry.TRACKS.values()}
#: The erase rule whose benchmark a text track's subspace methods count.
TEXT_ERASE_RULE = (
    "erase_merged" if "merged" in config["erase"]["outputs"] else "erase_adapter"
)


def cost_components(
    exp,
    methods,
    rank,
    erase_rule,
    lora_rule="lora",
    baseline_rule="baseline",
    adapters=None,
):
    """Per method of an experiment, the benchmark files of the jobs that produce its evaluated model.

    Subspace methods: LoRA training (forget + retain; none for a set in `adapters`, given by the
    user), task-matrix extraction, and the closed-form erase (factors of both sets, [energy],
    forget_update, erase). Baselines: their training job. Shared jobs count fully for every method
    that needs them. Rows in the order of `methods`, as in the track's table.
    """
    sets = ("forget", "retain")
    given = adapters or {}
    out = {}
    for method in methods:
        if method not in DECOMP:
            job = benchmark_path(baseline_rule, "exp", "method", exp=exp, method=method)
            out[method] = {"baseline_s": [job]}
            continue
        decomp = DECOMP[method]
        erase = [
            benchmark_path(
                "factors",
                "exp",
                "rank",
                "decomp",
                "set",
                exp=exp,
                rank=rank,
                decomp=decomp,
                set=s,
            )
            for s in sets
        ]
        if registry.is_localised(method):
            erase.append(benchmark_path("energy", "exp", exp=exp))
        erase += [
            benchmark_path(
                "forget_update",
                "exp",
                "rank",
                "decomp",
                exp=exp,
                rank=rank,
                decomp=decomp,
            ),
            benchmark_path(
                erase_rule, "exp", "rank", "method", exp=exp, rank=rank, method=method
            ),
        ]
        out[method] = {
            "lora_s": [
                benchmark_path(lora_rule, "exp", "set", exp=exp, set=s)
                for s in sets
                if not given.get(s)
            ],
            "task_matrices_s": [
                benchmark_path("task_matrices", "exp", "set", exp=exp, set=s)
                for s in sets
            ],
            "erase_s": erase,
        }
    return out


def track_costs(track):
    """A track's cost groups, {group: {method: components}}: its bound `costs()` in
    rules/<track>/common.smk (qrerase.tracks.Track.bind), e.g. one per cross-lingual unlearning
    language, one per speech setting, the single '' group of the TOFU and task experiments.
    """
    return registry.TRACKS[track].function("costs")()


def cost_inputs(wildcards):
    """Every benchmark file a track's cost table reads."""
    return [
        f
        for components in track_costs(wildcards.track).values()
        for parts in components.values()
        for files in parts.values()
        for f in files
    ]


def cost_targets(track):
    return expand(PATHS["table"], table=f"{track}_cost", ext=["csv", "md"])
