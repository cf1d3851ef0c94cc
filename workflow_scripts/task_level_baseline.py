"""Rule task_level_baseline: unlearn the forget skill with Gradient Ascent, KGA or KU."""

import pandas as pd

from qrerase.baselines.task_level import KgaConfig, KuConfig, train_kga, train_ku
from qrerase.baselines.text import TextBaselineConfig, train_baseline
from qrerase.checkpoints import save_model
from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.io import read_jsonl, write_csv
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, load_model, load_tokenizer
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
method = snakemake.wildcards.method
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    common = {"max_length": p.max_length, "seed": p.seed, "threads": snakemake.threads}
    dtype, device = model_options(p.model)
    model, tokenizer = load_model(inp.model, dtype=dtype, device=device), load_tokenizer(inp.model)
    forget, retain, new = read_jsonl(inp.forget), read_jsonl(inp.retain), read_jsonl(inp.new)
    template = template_from(p.model)
    log.info("%s on %d forget / %d retain / %d new QA: %s", method, len(forget), len(retain), len(new), dict(p.cfg))
    if method == "ga":
        cfg = TextBaselineConfig.from_dict({**p.cfg, **common, "method": "ga"})
        model, curve = train_baseline(model, None, tokenizer, forget, retain, template, cfg, desc="task-ga")
    elif method == "kga":
        cfg = KgaConfig.from_dict({**p.cfg, **common})
        if "init" in inp.keys():
            initial = load_model(inp.init, dtype=dtype, device=device)
        elif p.model["name_or_path"] is None:
            initial = build_tiny_llama(TinyLlamaConfig(**p.model["tiny"]), tokenizer, seed=p.seed).to(model.device)
        else:
            initial = load_model(
                p.model["name_or_path"],
                dtype=dtype,
                device=device,
                local_files_only=p.model.get("local_files_only", True),
            )
        model, curve = train_kga(model, initial, tokenizer, forget, retain, new, template, cfg, desc="task-kga")
    else:
        cfg = KuConfig.from_dict({**p.cfg, **common})
        model, curve, info = train_ku(model, tokenizer, forget, new, template, cfg, desc="task-ku")
        log.info("KU memorisation criterion: %s", info)
    if is_main_process():  # rank 0 writes; every rank holds the full trained weights
        save_model(model, tokenizer, out.model)
        write_csv(out.curve, pd.DataFrame(curve))
    if curve:
        log.info("first/last step: %s / %s", curve[0], curve[-1])
