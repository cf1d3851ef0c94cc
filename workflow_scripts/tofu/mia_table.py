"""Rule tofu_mia_table: membership-inference AUCs (forget vs holdout), PrivLeak against the retain
reference, extraction strength and exact memorisation of every evaluated TOFU model."""

import dataclasses
from pathlib import Path

from qrerase.metrics.rows import load_sequence_metrics
from qrerase.registry import method_labels
from qrerase.reports.tables import write_table
from qrerase.tracks.tofu.mia import mia_table
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    values = {row: load_sequence_metrics(Path(d) / "sequence_metrics.json") for row, d in zip(p.rows, inp.logs)}
    df, spec = mia_table(values, reference="retain")
    spec = dataclasses.replace(spec, labels=method_labels(), reference_rows=(*spec.reference_rows, *p.controls))
    write_table(df, spec, out.csv, out.md, None)
    log.info("MIA table: %d models", len(df))
