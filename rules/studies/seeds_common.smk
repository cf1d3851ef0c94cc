# Seeds (`snakemake seeds --cores 2`): the tracks' headline tables over every seed of `seeds`.
# The run of `seed` is the default run's (results/); every other seed S runs this whole workflow again
# as a Snakemake module of this Snakefile with config seed = S, its results/ replaced by
# results/seeds/s<S>/ (module replace_prefix) and its rules named seed<S>_<rule>. The module statement
# takes a fixed name, so the modules are declared through its Python form (workflow.module /
# workflow.userule, what `snakemake --print-compilation` shows for `module ...:` / `use rule * from`).

SEEDS = list(config.get("seeds") or [])
SEED_TABLES = [t for track in config["tracks"] for t in registry.TRACKS[track].tables]


def seed_results(seed):
    """The results/ folder of a seed's run: results/ for `seed`, results/seeds/s<S>/ for another."""
    return "results/" if seed == config["seed"] else f"results/seeds/s{seed}/"


for _s in SEEDS:
    if _s != config["seed"]:
        workflow.module(
            f"seed{_s}",
            snakefile=workflow.main_snakefile,
            config={**config, "seed": _s, "seeds": [_s]},
            replace_prefix={"results/": seed_results(_s)},
        )
        workflow.userule(
            rules=["*"],
            from_module=f"seed{_s}",
            exclude_rules=[],
            name_modifier=f"seed{_s}_*",
            lineno=1,
        )(lambda: None)


def seed_table_inputs(wildcards):
    """One headline table (CSV) from the run of every seed of `seeds`, in that order."""
    return [seed_results(s) + f"tables/{wildcards.table}.csv" for s in SEEDS]


def seeds_targets():
    """`snakemake seeds`: the seed spread of every headline table of the configured tracks."""
    return expand(
        PATHS["table"], table=[f"{t}_seeds" for t in SEED_TABLES], ext=["csv", "md"]
    )
