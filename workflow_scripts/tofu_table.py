"""Rule tofu_table: the paper's TOFU table (and a wide variant) plus the truth-ratio figure."""

import dataclasses

import pandas as pd

from qrerase.registry import method_labels
from qrerase.reports.plots import truth_ratio_plot
from qrerase.reports.tables import write_table
from qrerase.reports.tofu import tofu_table
from qrerase.text.tofu import truth_ratios
from qrerase.text.tofu_log import load_log
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    rows = pd.concat([pd.read_csv(f) for f in inp.metrics], ignore_index=True)
    labels = {**method_labels(), **p.imported}
    split = snakemake.config["tofu"]["data"]["split"]
    caption = (
        f"TOFU {split}: Model Utility and Forget Quality (KS p-value of the forget-set truth ratios "
        f"against the retain-only reference; checkmark: p > 0.1). Subspace methods at rank k={p.rank}. "
        "Bold/underlined: best/second-best. Control rows (the same edit built from the retain adapter) "
        "are not ranked."
    )
    for wide, key in ((False, "tofu"), (True, "tofu_wide")):
        df, spec = tofu_table(rows, wide=wide)
        spec = dataclasses.replace(
            spec,
            labels=labels,
            tex_labels={**spec.tex_labels, **p.imported},
            reference_rows=(*spec.reference_rows, *p.imported, *p.controls),
        )
        write_table(
            df,
            spec,
            out[f"{key}_csv"],
            out[f"{key}_md"],
            out[f"{key}_tex"],
            caption=caption,
            label=f"tab:{key}",
            environment="table*" if wide else "table",
        )
    ratios = {
        labels.get(row, row): truth_ratios(load_log(directory)["eval_log_forget.json"])
        for row, directory in zip(p.rows, inp.logs)
    }
    pvalues = truth_ratio_plot(ratios, labels[p.reference], out.truth_ratio)
    log.info("forget-set truth-ratio KS p-values: %s", pvalues)
