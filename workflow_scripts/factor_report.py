"""Rule factor_report: per-module energy, reconstruction errors, CPQR-vs-SVD angles and the eq. 10 bound."""

from qrerase.method.adapters import load_factors
from qrerase.io import write_csv
from qrerase.method.diagnostics import factor_report
from qrerase.workflow.job import job

with job(snakemake) as log:  # noqa: F821
    p = snakemake.params  # noqa: F821
    report = factor_report(
        load_factors(snakemake.input.forget),  # noqa: F821
        load_factors(snakemake.input.retain),  # noqa: F821
        p.rank,
        retain_rank=p.retain_rank,
        energy_granularity=p.granularity,
    )
    write_csv(snakemake.output[0], report)  # noqa: F821
    log.info("max sin(Theta) CPQR vs SVD: %.3g", report["max_sin_theta_qr_vs_svd"].max())
