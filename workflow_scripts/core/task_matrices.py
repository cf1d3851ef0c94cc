"""Rule task_matrices: T = (lora_alpha / r) B A per adapted module, stored factored (safetensors)."""

from qrerase.method.adapters import check_adapter_fits, read_adapter_config, save_factors, task_matrices
from qrerase.workflow.job import job

with job(snakemake) as log:
    inp = snakemake.input
    factors = task_matrices(inp.adapter)
    check_adapter_fits(inp.adapter, factors, inp.model)  # one line naming adapter, model and module
    if snakemake.config["lora"]["adapters"].get(snakemake.wildcards.set):  # a user's adapter
        # planning refused another base unless this key accepted it: read here, it enters the record
        accepted = snakemake.config["lora"].get("accept_other_base", False)
        base = read_adapter_config(inp.adapter).base_model_name_or_path
        log.info("user adapter trained on %r (lora.accept_other_base: %s)", base, accepted)
    save_factors(snakemake.output[0], factors)
    log.info("%d task matrices from %s (fit %s)", len(factors), inp.adapter, inp.model)
