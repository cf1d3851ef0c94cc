"""Rule tofu_table: the paper's TOFU table (and a wide variant) plus the truth-ratio figure.

The privacy columns (PrivLeak, the default attack's AUC) come from each evaluated model's
sequence_metrics.json (input 'logs': the eval folders of params.rows, the retain reference among them);
imported models have none and show them as missing."""

import dataclasses
from pathlib import Path

import pandas as pd

from qrerase.metrics.log_metrics import FORGET_QUALITY_THRESHOLD, truth_ratios
from qrerase.metrics.rows import load_sequence_metrics
from qrerase.registry import method_labels
from qrerase.reports.plots import truth_ratio_plot
from qrerase.reports.tables import write_table
from qrerase.text.eval_log import load_log
from qrerase.tracks.tofu.tables import privacy_frame, tofu_table
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    rows = pd.concat([pd.read_csv(f) for f in inp.metrics], ignore_index=True)
    sequence = {row: load_sequence_metrics(Path(d) / "sequence_metrics.json") for row, d in zip(p.rows, inp.logs)}
    privacy = privacy_frame(sequence, reference=p.reference)
    labels = {**method_labels(), **p.imported}
    split = snakemake.config["tofu"]["data"]["split"]
    caption = (
        f"TOFU {split}: Model Utility and Forget Quality (KS p-value of the forget-set truth ratios "
        f"against the retain-only reference; checkmark: p > {FORGET_QUALITY_THRESHOLD:g}); PrivLeak "
        "(MUSE, Min-K\\% AUC against the retain reference's; ideal 0) and the Min-K\\%++ membership-"
        f"inference AUC of forget vs holdout answers (ideal 0.5). Subspace methods at rank k={p.rank}. "
        "Bold/underlined: best/second-best (closest to the ideal for PrivLeak and the AUC). Control rows "
        "(the same edit built from the retain adapter) are not ranked."
    )
    for wide, key in ((False, "tofu"), (True, "tofu_wide")):
        df, spec = tofu_table(rows, wide=wide, privacy=privacy)
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
