"""Rule task_level_tradeoff_erase: one subspace method at every (k, λ) of task_level.tradeoff, erased in-process
from the λ-free factors; the held-out slice's answer NLL and each role's accuracy and NLL per point."""

import pandas as pd

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.method.energy import selected_updates
from qrerase.method.formats import load_decompositions
from qrerase.text.evaluation import EvalConfig
from qrerase.tracks.task_level.evaluation import evaluate_roles
from qrerase.tracks.task_level.tradeoff import erase_points, held_out_nll, point_row
from qrerase.workflow.job import job, load_checkpoint, template_from
from qrerase.workflow.naming import format_model

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    method = snakemake.wildcards.method
    dtype, device = model_options(p.model)
    model, tokenizer = load_checkpoint(inp.model, dtype=dtype, device=device)
    template = template_from(p.model)
    cfg = EvalConfig.from_dict(p.evaluate)
    records = {role: [r for f in files for r in read_jsonl(inp[f])] for role, files in p.roles.items()}
    tune = read_jsonl(inp.tune)
    factors = {k: (load_decompositions(inp[f"forget_k{k}"]), load_decompositions(inp[f"retain_k{k}"])) for k in p.ranks}
    modules = list(selected_updates(factors[p.ranks[0]][0], inp.get("selected")))
    rows = []
    for k, lam in erase_points(model, factors, p.scales, modules=modules, retain_rank=p.retain_rank):
        roles = evaluate_roles(model, tokenizer, template, records, p.skills, cfg, format_model(method, k))
        rows.append(point_row(method, k, lam, held_out_nll(model, tokenizer, template, tune, cfg), roles))
        log.info("%s", {c: round(v, 4) if isinstance(v, float) else v for c, v in rows[-1].items()})
    write_csv(snakemake.output[0], pd.DataFrame(rows))
