"""Rules pretrain and finetune: train the embedded model's pretrained checkpoint (built on the run's
tokenizer), or the "fine-tuned" (forget + retain) / retain-only reference model (from the pretrained
checkpoint, or from the hub model named by model.name_or_path)."""

from qrerase.io import read_jsonl, write_csv
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, load_model, load_tokenizer
from qrerase.checkpoints import resolve_device, save_model
from qrerase.text.training import TrainConfig, train_causal_lm
from qrerase.engine import resuming
from qrerase.workflow.job import job, template_from, resume_dir
from qrerase.config import model_options

p = snakemake.params  # noqa: F821
inp = snakemake.input  # noqa: F821
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):  # noqa: F821
    mcfg = p.model
    dtype, device = model_options(mcfg)
    if "tokenizer" in inp.keys():  # rule pretrain: a new tiny Llama on the run's tokenizer
        tokenizer = load_tokenizer(inp.tokenizer)
        model = build_tiny_llama(TinyLlamaConfig(**mcfg["tiny"]), tokenizer, seed=p.seed)
        model = model.to(resolve_device(device))
    elif "init" in inp.keys():  # the embedded model's fine-tuning: from the pretrained checkpoint
        tokenizer = load_tokenizer(inp.init)
        model = load_model(inp.init, dtype=dtype, device=device)
    else:  # a hub / local model: its checkpoint is the pretrained model
        local = mcfg.get("local_files_only", True)
        tokenizer = load_tokenizer(mcfg["name_or_path"], local_files_only=local)
        model = load_model(mcfg["name_or_path"], dtype=dtype, local_files_only=local, device=device)
    records = read_jsonl(inp.data)
    which = snakemake.wildcards.get("which", "pretrained")  # noqa: F821
    cfg = TrainConfig.from_dict({**p.train, "seed": p.seed, "threads": snakemake.threads})  # noqa: F821
    log.info("training %s on %d QA pairs: %s", which, len(records), cfg)
    curve = train_causal_lm(model, tokenizer, records, template_from(mcfg, tokenizer), cfg, desc=which)
    save_model(model, tokenizer, snakemake.output.model)  # noqa: F821
    write_csv(snakemake.output.curve, curve)  # noqa: F821
