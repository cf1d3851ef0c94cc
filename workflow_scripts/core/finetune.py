"""Rule finetune: the "fine-tuned" (forget + retain) model and the retain-only reference, from the
pretrained checkpoint (rule pretrain, workflow_scripts/core/pretrain.py), from a new tiny Llama on the
run's tokenizer (the task-level track's model from scratch), or from the hub model named by
model.name_or_path; a full fine-tune, or a LoRA adapter merged after (finetune.mode: lora)."""

from qrerase.config import model_options
from qrerase.engine import resuming, sharded
from qrerase.io import read_jsonl, write_csv
from qrerase.method.architectures import resolve_target_modules
from qrerase.models.checkpoints import save_model
from qrerase.text.models import load_start
from qrerase.text.training import LoraTrainConfig, TrainConfig, train_causal_lm, train_lora
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p = snakemake.params
inp = snakemake.input
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    mcfg = p.model
    dtype, device = model_options(mcfg)
    train = {k: v for k, v in {**p.train, **p.engine}.items() if k not in ("mode", "lora")}  # engine: the plan's
    cfg = TrainConfig.from_dict({**train, "seed": p.seed, "threads": snakemake.threads})
    shard = sharded(cfg.backend)  # FSDP2 over several processes: rank 0 alone reads the weights
    model, tokenizer = load_start(
        {k: inp[k] for k in ("tokenizer", "init") if k in inp.keys()}, mcfg, p.seed, dtype, device, shard
    )
    records = read_jsonl(inp.data)
    which = snakemake.wildcards.which
    template = template_from(mcfg, tokenizer)
    shape = p.get("adapter")  # finetune.mode: lora (rule finetune): a LoRA adapter, merged after
    if shape:
        modules = tuple(resolve_target_modules(model, shape["target_modules"], "finetune.lora.target_modules"))
        lcfg = LoraTrainConfig(
            r=shape["r"], alpha=shape["alpha"], dropout=shape["dropout"], target_modules=modules, train=cfg
        )
        log.info("LoRA fine-tuning %s on %d QA pairs, merged after: %s", which, len(records), lcfg)
        peft_model, curve = train_lora(model, tokenizer, records, template, lcfg, desc=which)
        model = peft_model.merge_and_unload()
    else:
        log.info("training %s on %d QA pairs: %s", which, len(records), cfg)
        curve = train_causal_lm(model, tokenizer, records, template, cfg, desc=which)
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_model(model, tokenizer, snakemake.output.model)
        write_csv(snakemake.output.curve, curve)
