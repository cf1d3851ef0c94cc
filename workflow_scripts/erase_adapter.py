"""Rule erase_adapter: the erase edit (eq. 6, or eq. 16 on the selected layers) as a PEFT LoRA adapter."""

from qrerase.erase import save_erase_adapter
from qrerase.linalg import load_updates
from qrerase.workflow import job, selected_updates

with job(snakemake) as log:  # noqa: F821
    inp = snakemake.input  # noqa: F821
    updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
    save_erase_adapter(updates, snakemake.output[0], base_model_name_or_path=str(inp.model))  # noqa: F821
    log.info("erase adapter over %d modules", len(updates))
