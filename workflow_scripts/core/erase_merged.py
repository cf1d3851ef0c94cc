"""Rule erase_merged: W' = W - lambda T~_f merged into a checkpoint (eq. 6, or eq. 16 on selected layers),
streamed shard by shard on the CPU (qrerase.method.stream_erase; no GPU, one shard in memory)."""

from qrerase.method.energy import selected_updates
from qrerase.method.formats import load_updates
from qrerase.method.stream_erase import erase_checkpoint
from qrerase.workflow.job import job

with job(snakemake) as log:
    inp = snakemake.input
    updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
    erase_checkpoint(inp.model, updates, snakemake.output[0])
    log.info("merged erase edit into %d modules, shard by shard", len(updates))
