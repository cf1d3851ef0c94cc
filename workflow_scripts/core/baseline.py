"""Rule baseline: unlearn the forget set from the fine-tuned model with an optimisation baseline."""

import pandas as pd

from qrerase.baselines.text import TextBaselineConfig, loads_sharded, objective_of, read_refusals, train_baseline
from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.io import read_jsonl, write_csv
from qrerase.models.checkpoints import save_model
from qrerase.text.models import load_model, load_tokenizer
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    cfg = TextBaselineConfig.from_dict({**p.baseline, **p.engine, "seed": p.seed, "threads": snakemake.threads})
    dtype, device = model_options(p.model)
    shard, shard_ref = loads_sharded(cfg)  # FSDP2 over several processes: rank 0 alone reads the weights
    model = load_model(inp.model, dtype=dtype, device=device, sharded=shard)
    ref_model = None  # LoRA mode: π_ref is the adapter-disabled model itself
    if objective_of(cfg.method).needs_reference and cfg.mode != "lora":
        ref_model = load_model(inp.model, dtype=dtype, device=device, sharded=shard_ref)
    tokenizer = load_tokenizer(inp.model)
    forget, retain = read_jsonl(inp.forget), read_jsonl(inp.retain)
    refusals = read_refusals(inp.refusals) if "refusals" in inp.keys() else None
    log.info("%s on %d forget / %d retain QA pairs: %s", cfg.method, len(forget), len(retain), cfg)
    model, curve = train_baseline(
        model,
        ref_model,
        tokenizer,
        forget,
        retain,
        template_from(p.model, tokenizer),
        cfg,
        refusals=refusals,
        desc=f"{snakemake.wildcards.exp}-{cfg.method}",
    )
    if is_main_process():  # rank 0 writes; it holds the full trained weights (on its CPU after FSDP2)
        save_model(model, tokenizer, out.model)
        write_csv(out.curve, pd.DataFrame(curve))
    log.info("first/last step: %s / %s", curve[0], curve[-1])
