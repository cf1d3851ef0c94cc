"""Rule lora: LoRA task adapter on the forget or the retain set, trained from the checkpoint that
`lora.base` names (the fine-tuned model, or the pretrained one)."""

from qrerase.config import model_options
from qrerase.engine import resuming, sharded
from qrerase.io import read_jsonl, write_csv
from qrerase.method.architectures import resolve_target_modules
from qrerase.text.models import load_model, load_tokenizer
from qrerase.text.training import ENGINE_KEYS, LoraTrainConfig, TrainConfig, save_adapter, train_lora
from qrerase.workflow.job import job, resume_dir, template_from
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p = snakemake.params
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    lcfg = {**p.lora, **p.engine}  # engine: the settings the memory plan planned (rules/common.smk)
    inp = snakemake.input
    # A hub model's pretrained checkpoint is no workflow file: loaded by name.
    source = inp.model if "model" in inp.keys() else p.model["name_or_path"]
    local = p.model.get("local_files_only", True)
    dtype, device = model_options(p.model)
    train_keys = ("epochs", "lr", "batch_size", "weight_decay", "warmup_ratio", "max_length", *ENGINE_KEYS)
    train = TrainConfig.from_dict(
        {**{k: lcfg[k] for k in train_keys if k in lcfg}, "seed": p.seed, "threads": snakemake.threads}
    )
    # FSDP2 over several processes: rank 0 alone reads the weights
    model = load_model(source, dtype=dtype, device=device, local_files_only=local, sharded=sharded(train.backend))
    tokenizer = load_tokenizer(source, local_files_only=local)
    records = read_jsonl(snakemake.input.data)
    cfg = LoraTrainConfig(
        r=lcfg["r"],
        alpha=lcfg["alpha"],
        dropout=lcfg.get("dropout", 0.0),
        target_modules=tuple(resolve_target_modules(model, lcfg["target_modules"])),
        train=train,
    )
    log.info(
        "LoRA on %d QA pairs (%s) from the %s model %s: %s",
        len(records),
        snakemake.wildcards.set,
        lcfg.get("base", "finetuned"),
        source,
        cfg,
    )
    peft_model, curve = train_lora(
        model, tokenizer, records, template_from(p.model, tokenizer), cfg, desc=f"lora-{snakemake.wildcards.set}"
    )
    if is_main_process():  # rank 0 writes; it holds the trained adapter (on its CPU after FSDP2)
        save_adapter(peft_model, snakemake.output.adapter)
        write_csv(snakemake.output.curve, curve)
