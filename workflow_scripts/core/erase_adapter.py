"""Rule erase_adapter: the erase edit (eq. 6, or eq. 16 on the selected layers) as a PEFT LoRA adapter."""

from qrerase.method.adapters import read_adapter_config
from qrerase.method.energy import selected_updates
from qrerase.method.erase import save_erase_adapter
from qrerase.method.formats import load_updates
from qrerase.method.stream_erase import check_edited_weights
from qrerase.workflow.job import job

with job(snakemake) as log:
    inp = snakemake.input
    updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
    # Conv1D (GPT-2 style) models: the forget adapter's fan_in_fan_out carries over to the erase adapter.
    fan_in_fan_out = read_adapter_config(inp.forget_adapter).fan_in_fan_out
    check_edited_weights(inp.model, updates, snakemake.output[0])  # W − U V finite, else nothing written
    save_erase_adapter(
        updates, snakemake.output[0], base_model_name_or_path=str(inp.model), fan_in_fan_out=fan_in_fan_out
    )
    log.info("erase adapter over %d modules (fan_in_fan_out=%s)", len(updates), fan_in_fan_out)
