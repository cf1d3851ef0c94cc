"""Rule factors: rank-k CPQR (eq. 1-2) or SVD of every task matrix, computed exactly from its factors."""

from qrerase.method.adapters import load_factors
from qrerase.method.decompose import decompose
from qrerase.method.formats import save_decompositions
from qrerase.workflow.job import job

with job(snakemake) as log:
    rank, decomp = snakemake.params.rank, snakemake.wildcards.decomp
    factors = load_factors(snakemake.input[0])
    decs = {m: decompose(f.B, f.A, rank, decomp=decomp, name=m) for m, f in factors.items()}
    save_decompositions(snakemake.output[0], decs)
    worst = max(d.relative_error for d in decs.values())
    log.info("%s rank %d of %d modules; worst relative error %.3g", decomp, rank, len(decs), worst)
