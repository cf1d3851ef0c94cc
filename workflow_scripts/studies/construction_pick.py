"""Rule construction_pick: one construction variant's TOFU-protocol point at its lambda rule's pick.

The rule (as tradeoff.max_retain_nll_rise everywhere): the largest swept lambda whose held-out retain
answer NLL rises by at most the bound above the unedited model's; it reads the variant's sweep alone.
At a pick of 0 (no lambda qualifies) the point is the unedited model's."""

import pandas as pd

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.method.adapters import task_matrices
from qrerase.method.energy import select_modules
from qrerase.method.erase import apply_updates
from qrerase.text.construction import construction_updates, with_unedited
from qrerase.text.eval_log import EVAL_SETS
from qrerase.text.evaluation import EvalConfig
from qrerase.text.size_study import rule_pick
from qrerase.text.tradeoff import evaluate_text_point, point_reference
from qrerase.workflow.job import job, load_checkpoint, template_from

p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
with job(snakemake, seed=p.seed) as log:
    sweep = with_unedited(pd.read_csv(inp.points), pd.read_csv(inp.unedited).iloc[0])
    scale = rule_pick(sweep["scale"], sweep["tune_retain_nll"], float(p.max_rise))
    dtype, device = model_options(p.model)
    model, tokenizer = load_checkpoint(inp.model, dtype=dtype, device=device)
    if scale > 0:
        forget, retain = task_matrices(inp.forget_adapter), task_matrices(inp.retain_adapter)
        modules = select_modules(forget, p.granularity) if p.localised else None
        updates, _ = construction_updates(forget, retain, int(wc.rank), p.decomp, wc.projector, modules)
        apply_updates(model, {n: (U * scale, V) for n, (U, V) in updates.items()})
    meta = {"group": p.group, "method": wc.method, "family": "subspace", "rank": int(wc.rank), "scale": scale}
    row = evaluate_text_point(
        model,
        tokenizer,
        template_from(p.model, tokenizer),
        {name: read_jsonl(inp[f"eval_{name}"]) for name in EVAL_SETS},
        read_jsonl(inp.tune),
        point_reference(inp.reference, p.lang),
        EvalConfig.from_section(p.evaluate),
        {**meta, "epochs": None},
        protocol="full",
    )
    row.insert(0, "projector", wc.projector)
    row.insert(0, "start", wc.start)
    write_csv(snakemake.output[0], row)
    log.info("pick lambda %g: %s", scale, row.iloc[0][["model_utility", "forget_quality", "tune_retain_nll"]].to_dict())
