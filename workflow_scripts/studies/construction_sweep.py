"""Rules construction_unedited and construction_sweep (docs/real-model.md, "The construction study").

construction_unedited: the fine-tuned model's answer NLLs on the forget and retain evaluation sets and
the held-out slice (the lambda = 0 point). construction_sweep: one variant's T~_f at lambda = 1 (eqs. 3-5
under its retain projector, eq. 16's layers for an LL method), W' = W - lambda T~_f at each lambda of the
doubling grid from the original weights until the held-out NLL has risen past construction.stop_rise,
and per module the quantities that explain the edit's size."""

import pandas as pd
import torch

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.method.adapters import task_matrices
from qrerase.method.energy import select_modules
from qrerase.method.erase import apply_updates
from qrerase.text.construction import construction_updates, doubling_sweep, explaining_rows
from qrerase.text.evaluation import EvalConfig
from qrerase.text.tradeoff import evaluate_text_point
from qrerase.workflow.job import job, load_checkpoint, template_from

p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
with job(snakemake, seed=p.seed) as log:
    dtype, device = model_options(p.model)
    model, tokenizer = load_checkpoint(inp.model, dtype=dtype, device=device)
    template = template_from(p.model, tokenizer)
    sets = {"forget": read_jsonl(inp.eval_forget), "retain": read_jsonl(inp.eval_retain)}
    tune = read_jsonl(inp.tune)
    cfg = EvalConfig.from_section(p.evaluate)

    def nlls(meta):
        row = evaluate_text_point(model, tokenizer, template, sets, tune, {}, cfg, meta, protocol="nll")
        return {c: float(row.iloc[0][c]) for c in ("forget_nll", "retain_nll", "tune_retain_nll")}

    if snakemake.rule == "construction_unedited":
        row = {"scale": 0.0, **nlls({})}
        write_csv(snakemake.output[0], pd.DataFrame([row]))
        log.info("unedited: %s", row)
    else:
        unedited = pd.read_csv(inp.unedited).iloc[0]
        forget, retain = task_matrices(inp.forget_adapter), task_matrices(inp.retain_adapter)
        modules = select_modules(forget, p.granularity) if p.localised else None
        updates, details = construction_updates(forget, retain, int(wc.rank), p.decomp, wc.projector, modules)
        params = {n: model.get_submodule(n).weight for n in updates}
        original = {n: w.detach().clone() for n, w in params.items()}

        def point(scale):
            with torch.no_grad():
                for n, w in params.items():
                    w.copy_(original[n])
            apply_updates(model, {n: (U * scale, V) for n, (U, V) in updates.items()})
            values = nlls({})
            log.info("lambda %g: %s", scale, values)
            return values

        rows = doubling_sweep(point, p.scales, float(unedited["tune_retain_nll"]), float(p.stop_rise))
        variant = {"start": wc.start, "projector": wc.projector, "rank": int(wc.rank), "method": wc.method}
        for r in rows:
            r["forget_rise"] = r["forget_nll"] - float(unedited["forget_nll"])
            r["retain_rise"] = r["retain_nll"] - float(unedited["retain_nll"])
            r["tune_retain_rise"] = r["tune_retain_nll"] - float(unedited["tune_retain_nll"])
        write_csv(snakemake.output.points, pd.DataFrame([{**variant, **r} for r in rows]))
        write_csv(
            snakemake.output.modules,
            pd.DataFrame([{**variant, **r} for r in explaining_rows(forget, updates, details)]),
        )
        log.info("%d points, %d modules edited", len(rows), len(updates))
