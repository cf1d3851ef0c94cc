"""Rule task_level_baseline: unlearn the forget skill with a task-level baseline (Gradient Ascent, KGA,
KU or a plug-in's), its registered runner (qrerase.tracks.task_level.runners)."""

import pandas as pd

from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.io import read_jsonl, write_csv
from qrerase.models.checkpoints import save_model
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, load_model, load_tokenizer
from qrerase.tracks.task_level.runners import TaskLevelBaselineJob, loads_sharded, run_task_level_baseline
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
method = snakemake.wildcards.method
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    common = {"max_length": p.max_length, "seed": p.seed, "threads": snakemake.threads}
    dtype, device = model_options(p.model)
    shard = loads_sharded(method, p.engine["backend"])  # FSDP2 over several processes: rank 0 alone reads
    model, tokenizer = load_model(inp.model, dtype=dtype, device=device, sharded=shard), load_tokenizer(inp.model)
    forget, retain, new = read_jsonl(inp.forget), read_jsonl(inp.retain), read_jsonl(inp.new)
    template = template_from(p.model)
    log.info("%s on %d forget / %d retain / %d new QA: %s", method, len(forget), len(retain), len(new), dict(p.cfg))

    def initial():
        """The checkpoint the fine-tuned model was trained from (KGA's auxiliary models start there)."""
        if "init" in inp.keys():
            return load_model(inp.init, dtype=dtype, device=device, sharded=shard)
        if p.model["name_or_path"] is None:
            return build_tiny_llama(TinyLlamaConfig(**p.model["tiny"]), tokenizer, seed=p.seed).to(model.device)
        return load_model(
            p.model["name_or_path"],
            dtype=dtype,
            device=device,
            local_files_only=p.model.get("local_files_only", True),
            sharded=shard,
        )

    model, curve = run_task_level_baseline(
        TaskLevelBaselineJob(
            method,
            model,
            tokenizer,
            forget,
            retain,
            new,
            template,
            {**p.cfg, **p.engine, **common},
            initial,
            f"task-{method}",
            log,
        )
    )
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_model(model, tokenizer, out.model)
        write_csv(out.curve, pd.DataFrame(curve))
    if curve:
        log.info("first/last step: %s / %s", curve[0], curve[-1])
