"""Rule size_study_table: the size study's table (mean ± sd over seeds per width and method), the
per-seed points, the log-log trend of selectivity with its extrapolation, and the figure."""

import pandas as pd

from qrerase.io import write_csv, write_text
from qrerase.reports.size_study import aggregate, render_markdown, size_study_plot, trend
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    per_seed = pd.concat([pd.read_csv(f) for f in inp.rows], ignore_index=True)
    agg = aggregate(per_seed)
    fits = trend(per_seed)
    write_csv(out.points, per_seed)
    write_csv(out.csv, agg)
    write_csv(out.trend, fits)
    write_text(out.md, render_markdown(agg, fits, p.target, p.max_rise))
    size_study_plot(agg, fits, out.figure, title="Size study: selectivity and Forget Quality vs parameters")
    log.info(
        "size study: %d widths x %d methods\n%s",
        agg["width"].nunique(),
        agg["method"].nunique(),
        fits.to_string(index=False),
    )
