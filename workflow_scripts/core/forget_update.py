"""Rule forget_update: Q~_f = (I - P_r) Q_f,k and lambda T~_f = U V per module (eqs. 3-5)."""

from qrerase.method.discriminate import discriminate
from qrerase.method.formats import load_decompositions, save_updates
from qrerase.workflow.job import job

with job(snakemake) as log:
    p = snakemake.params
    forget = load_decompositions(snakemake.input.forget)
    retain = load_decompositions(snakemake.input.retain)
    updates = discriminate(forget, retain, retain_rank=p.retain_rank, scale=p.scale)
    save_updates(snakemake.output[0], updates)
    log.info("forget updates for %d modules (scale %s)", len(updates), p.scale)
