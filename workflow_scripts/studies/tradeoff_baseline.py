"""Rule tradeoff_baseline: one sweep point of an optimisation baseline (its configured run, with the
number of epochs of the point), evaluated with the TOFU protocol in this process (no checkpoint kept)."""

from qrerase.baselines.text import TextBaselineConfig, loads_sharded, objective_of, read_refusals, train_baseline
from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.io import read_jsonl, write_csv
from qrerase.text.eval_log import EVAL_SETS
from qrerase.text.evaluation import EvalConfig
from qrerase.text.models import load_model, load_tokenizer
from qrerase.text.tradeoff import evaluate_text_point, point_reference
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    epochs = int(wc.epochs)
    settings = {**p.baseline, **p.engine, "epochs": epochs, "seed": p.seed, "threads": snakemake.threads}
    cfg = TextBaselineConfig.from_dict(settings)
    dtype, device = model_options(p.model)
    shard, shard_ref = loads_sharded(cfg)  # FSDP2 over several processes: rank 0 alone reads the weights
    model = load_model(inp.model, dtype=dtype, device=device, sharded=shard)
    ref_model = None  # LoRA mode: π_ref is the adapter-disabled model itself
    if objective_of(cfg.method).needs_reference and cfg.mode != "lora":
        ref_model = load_model(inp.model, dtype=dtype, device=device, sharded=shard_ref)
    tokenizer = load_tokenizer(inp.model)
    template = template_from(p.model, tokenizer)
    refusals = read_refusals(inp.refusals) if "refusals" in inp.keys() else None
    model, _ = train_baseline(
        model,
        ref_model,
        tokenizer,
        read_jsonl(inp.forget),
        read_jsonl(inp.retain),
        template,
        cfg,
        refusals=refusals,
        desc=f"{wc.exp}-{cfg.method}-e{epochs}",
    )
    if is_main_process():  # rank 0 evaluates and writes; it holds the full trained weights (on its CPU after FSDP2)
        tune = read_jsonl(inp.tune) if "tune" in inp.keys() else []  # cross-lingual: no held-out slice
        eval_sets = {name: read_jsonl(inp[f"eval_{name}"]) for name in EVAL_SETS}
        ecfg = EvalConfig.from_section(p.evaluate)
        meta = {
            "group": p.group,
            "method": wc.method,
            "family": "baseline",
            "rank": None,
            "scale": None,
            "epochs": epochs,
        }
        row = evaluate_text_point(
            model,
            tokenizer,
            template,
            eval_sets,
            tune,
            point_reference(inp.reference, p.lang),
            ecfg,
            meta,
            protocol=p.protocol,
        )
        write_csv(snakemake.output[0], row)
        log.info(
            "%s",
            row.iloc[0][["model_utility", "forget_quality", "forget_nll", "retain_nll", "tune_retain_nll"]].to_dict(),
        )
