"""Rule task_matrices: T = (lora_alpha / r) B A per adapted module, stored factored (safetensors)."""

from qrerase.method.adapters import check_adapter_fits, save_factors, task_matrices
from qrerase.workflow.job import job

with job(snakemake) as log:
    inp = snakemake.input
    factors = task_matrices(inp.adapter)
    check_adapter_fits(inp.adapter, factors, inp.model)  # one line naming adapter, model and module
    save_factors(snakemake.output[0], factors)
    log.info("%d task matrices from %s (fit %s)", len(factors), inp.adapter, inp.model)
