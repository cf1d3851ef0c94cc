"""Rule factor_report: per-module energy, reconstruction errors, CPQR-vs-SVD angles and the eq. 10 bound."""

from qrerase.io import write_csv
from qrerase.method.adapters import load_factors
from qrerase.method.diagnostics import factor_report
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
    )
    write_csv(snakemake.output[0], report)
    log.info("max sin(Theta) CPQR vs SVD: %.3g", report["max_sin_theta_qr_vs_svd"].max())
