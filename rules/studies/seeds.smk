# Seed spreads: every headline table of the configured tracks (qrerase.registry Track.tables) from the
# run of each seed of `seeds` (rules/studies/seeds_common.smk), as mean ± sd per cell.


include: "seeds_common.smk"


rule seed_table:
    # One headline table over the seeds: mean, sd, min, max and count per method and measure.
    input:
        tables=seed_table_inputs,
    output:
        csv=path("table", table="{table}_seeds", ext="csv"),
        md=path("table", table="{table}_seeds", ext="md"),
    log:
        log_path("seed_table", "table"),
    wildcard_constraints:
        table="|".join(SEED_TABLES) or "no-track",
    conda:
        "../../envs/linalg.yaml"
    threads: 1
    resources:
        **resources_for("light"),
    params:
        seeds=SEEDS,
    script:
        "../../workflow_scripts/studies/seed_table.py"


rule seeds:
    # Target: the seed spread of every headline table (not in the default target).
    input:
        seeds_targets(),
