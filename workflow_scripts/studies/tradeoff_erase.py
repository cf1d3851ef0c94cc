"""Rule tradeoff_erase: one sweep point of a subspace method, W' = W − λ T̃_f at rank k and scale λ
(the stored update rescaled by λ/λ₀, eq. 6 / 16), evaluated with the TOFU protocol in this process."""

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.method.energy import selected_updates
from qrerase.method.erase import apply_updates
from qrerase.method.formats import load_updates
from qrerase.text.eval_log import EVAL_SETS
from qrerase.text.evaluation import EvalConfig
from qrerase.text.tradeoff import evaluate_text_point, point_reference, scaled_updates
from qrerase.workflow.job import job, load_checkpoint, template_from

p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
with job(snakemake, seed=p.seed) as log:
    dtype, device = model_options(p.model)
    model, tokenizer = load_checkpoint(inp.model, dtype=dtype, device=device)
    scale = float(wc.scale)
    if scale != 0:
        if p.stored_scale == 0:
            raise ValueError("unlearn.scale is 0: the stored forget update is zero and cannot be rescaled")
        updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
        apply_updates(model, scaled_updates(updates, scale / p.stored_scale))
    tune = read_jsonl(inp.tune) if "tune" in inp.keys() else []  # cross-lingual: no held-out slice
    eval_sets = {name: read_jsonl(inp[f"eval_{name}"]) for name in EVAL_SETS}
    cfg = EvalConfig.from_section(p.evaluate)
    meta = {
        "group": p.group,
        "method": wc.method,
        "family": "subspace",
        "rank": int(wc.rank),
        "scale": scale,
        "epochs": None,
    }
    row = evaluate_text_point(
        model,
        tokenizer,
        template_from(p.model, tokenizer),
        eval_sets,
        tune,
        point_reference(inp.reference, p.lang),
        cfg,
        meta,
        protocol=p.protocol,
    )
    write_csv(snakemake.output[0], row)
    log.info(
        "%s", row.iloc[0][["model_utility", "forget_quality", "forget_nll", "retain_nll", "tune_retain_nll"]].to_dict()
    )
