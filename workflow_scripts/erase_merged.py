"""Rule erase_merged: W' = W - lambda T~_f merged into a checkpoint (eq. 6, or eq. 16 on selected layers)."""

from qrerase.method.erase import apply_updates, save_merged
from qrerase.method.formats import load_updates
from qrerase.workflow.job import job, load_checkpoint, selected_updates
from qrerase.config import model_options

with job(snakemake) as log:  # noqa: F821
    inp, p = snakemake.input, snakemake.params  # noqa: F821
    updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
    model, tokenizer = load_checkpoint(inp.model, getattr(p, "kind", "causal_lm"), dtype=model_options(p.model)[0])
    apply_updates(model, updates)
    save_merged(model, tokenizer, snakemake.output[0])  # noqa: F821
    log.info("merged erase edit into %d modules", len(updates))
