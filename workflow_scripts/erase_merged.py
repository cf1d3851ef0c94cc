"""Rule erase_merged: W' = W - lambda T~_f merged into a checkpoint (eq. 6, or eq. 16 on selected layers)."""

from qrerase.erase import apply_updates, save_merged
from qrerase.lm import load_model, load_tokenizer
from qrerase.linalg import load_updates
from qrerase.workflow import job, selected_updates

with job(snakemake) as log:  # noqa: F821
    inp = snakemake.input  # noqa: F821
    updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
    model = load_model(inp.model, dtype=snakemake.params.model.get("dtype", "float32"))  # noqa: F821
    apply_updates(model, updates)
    save_merged(model, load_tokenizer(inp.model), snakemake.output[0])  # noqa: F821
    log.info("merged erase edit into %d modules", len(updates))
