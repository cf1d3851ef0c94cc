"""Rule pretrain: the embedded model's pretrained checkpoint, a new tiny Llama built on the run's
tokenizer and trained on the pretraining set (authors in neither the forget nor the retain set, plus
the knowledge sets). A hub model (model.name_or_path) skips this rule: its checkpoint is the
pretrained model. Fine-tuning from this checkpoint: workflow_scripts/core/finetune.py."""

from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.io import read_jsonl, write_csv
from qrerase.models.checkpoints import save_model
from qrerase.text.models import load_start
from qrerase.text.training import TrainConfig, train_causal_lm
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p = snakemake.params
inp = snakemake.input
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    mcfg = p.model
    dtype, device = model_options(mcfg)
    model, tokenizer = load_start({"tokenizer": inp.tokenizer}, mcfg, p.seed, dtype, device, False)
    records = read_jsonl(inp.data)
    cfg = TrainConfig.from_dict({**p.train, **p.engine, "seed": p.seed, "threads": snakemake.threads})
    log.info("training pretrained on %d QA pairs: %s", len(records), cfg)
    curve = train_causal_lm(model, tokenizer, records, template_from(mcfg, tokenizer), cfg, desc="pretrained")
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_model(model, tokenizer, snakemake.output.model)
        write_csv(snakemake.output.curve, curve)
