"""Rule construction_tables: the construction study's table (CSV: variants and baselines; Markdown: also
the adapters' effects and the explaining quantities), its per-module-type table and the frontier figure."""

import pandas as pd

from qrerase.io import write_csv, write_text
from qrerase.reports.construction import (
    baseline_rows,
    construction_markdown,
    frontier_plot,
    module_summary,
    variant_rows,
)
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    unedited = pd.read_csv(inp.unedited).iloc[0]
    sweeps = pd.concat([pd.read_csv(f) for f in inp.sweeps], ignore_index=True)
    picks = pd.concat([pd.read_csv(f) for f in inp.picks], ignore_index=True) if inp.picks else pd.DataFrame()
    variants = variant_rows(sweeps, picks, unedited, float(p.max_rise))
    sweep = pd.concat([pd.read_csv(f) for f in inp.baseline_sweep], ignore_index=True)
    points = pd.concat([pd.read_csv(f) for f in inp.baselines], ignore_index=True)
    metrics = {pd.read_csv(f)["model"].iloc[0]: pd.read_csv(f) for f in inp.baseline_metrics}
    baselines = baseline_rows(sweep, points, metrics, unedited, float(p.max_rise))
    summary = module_summary(pd.concat([pd.read_csv(f) for f in inp.modules], ignore_index=True))
    effects = pd.concat([pd.read_csv(f) for f in inp.effects], ignore_index=True)
    base = pd.read_csv(inp.base_metrics)
    fine_tuned = {m: float(base.loc[base["metric"] == m, "value"].iloc[0]) for m in ("model_utility", "forget_quality")}
    table = pd.concat([variants.assign(family="subspace"), baselines.assign(family="baseline")], ignore_index=True)
    write_csv(out.csv, table)
    write_csv(out.modules, summary)
    write_text(
        out.md,
        construction_markdown(variants, baselines, effects, summary)
        + f"\nThe fine-tuned (unedited) model: Model Utility {fine_tuned['model_utility']:.4g}, "
        f"Forget Quality {fine_tuned['forget_quality']:.3g}.\n",
    )
    frontier_plot(sweeps, variants, baselines, out.figure, float(p.max_rise))
    log.info("%d variants, %d baseline points", len(variants), len(baselines))
