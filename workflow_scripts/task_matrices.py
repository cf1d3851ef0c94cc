"""Rule task_matrices: T = (lora_alpha / r) B A per adapted module, stored factored (safetensors)."""

from qrerase.adapters import save_factors, task_matrices
from qrerase.workflow import job

with job(snakemake) as log:  # noqa: F821
    factors = task_matrices(snakemake.input.adapter)  # noqa: F821
    save_factors(snakemake.output[0], factors)  # noqa: F821
    log.info("%d task matrices from %s", len(factors), snakemake.input.adapter)  # noqa: F821
