"""Rule factor_report: per-module energy, reconstruction errors, CPQR-vs-SVD angles and the eq. 10 bound.
With input 'selection' (rule energy's selected_layers.json or energy.csv), the forget set's `selected`
column is that selection, read (qrerase.method.energy.read_selection), not recomputed."""

from qrerase.io import write_csv
from qrerase.method.adapters import load_factors
from qrerase.method.diagnostics import factor_report
from qrerase.method.energy import read_selection
from qrerase.workflow.job import job

with job(snakemake) as log:
    p = snakemake.params
    report = factor_report(
        load_factors(snakemake.input.forget),
        load_factors(snakemake.input.retain),
        p.rank,
        retain_rank=p.retain_rank,
        energy_granularity=p.granularity,
        names=tuple(p.adapters),
        forget_selection=read_selection(snakemake.input.selection) if "selection" in snakemake.input.keys() else None,
    )
    write_csv(snakemake.output[0], report)
    log.info("max sin(Theta) CPQR vs SVD: %.3g", report["max_sin_theta_qr_vs_svd"].max())
