"""Rule seed_table: one headline table from the run of every seed as mean ± sd per cell
(qrerase.reports.seeds)."""

import pandas as pd

from qrerase.io import write_csv, write_text
from qrerase.reports.seeds import render_spread, seed_spread
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    seeds = list(p.seeds)
    tables = {s: pd.read_csv(f) for s, f in zip(seeds, inp.tables, strict=True)}
    spread = seed_spread(tables)
    write_csv(out.csv, spread)
    write_text(out.md, render_spread(spread, seeds, snakemake.wildcards.table))
    log.info("%s: %d methods over seeds %s", snakemake.wildcards.table, len(spread), seeds)
