"""Rule finetune: train the "fine-tuned" (forget + retain) or the retain-only reference model."""

from qrerase.io import read_jsonl, write_csv
from qrerase.lm import TinyLlamaConfig, build_tiny_llama, load_model, load_tokenizer, resolve_device, save_model
from qrerase.training import TrainConfig, train_causal_lm
from qrerase.workflow import job, template_from

p = snakemake.params  # noqa: F821
with job(snakemake, seed=p.seed) as log:  # noqa: F821
    mcfg = p.model
    if "init" in snakemake.input.keys():  # noqa: F821  (an initial checkpoint, e.g. a pretrained model)
        tokenizer = load_tokenizer(snakemake.input.init)  # noqa: F821
        model = load_model(snakemake.input.init, dtype=mcfg.get("dtype", "float32"), device=mcfg.get("device", "cpu"))  # noqa: F821
    elif mcfg["name_or_path"] is None:
        tokenizer = load_tokenizer(snakemake.input.tokenizer)
        model = build_tiny_llama(TinyLlamaConfig(**mcfg["tiny"]), tokenizer, seed=p.seed)
        model = model.to(resolve_device(mcfg.get("device", "cpu")))
    else:
        local = mcfg.get("local_files_only", True)
        tokenizer = load_tokenizer(mcfg["name_or_path"], local_files_only=local)
        model = load_model(
            mcfg["name_or_path"], dtype=mcfg.get("dtype", "float32"), local_files_only=local,
            device=mcfg.get("device", "cpu"),
        )
    records = read_jsonl(snakemake.input.data)
    cfg = TrainConfig.from_dict({**p.train, "seed": p.seed, "threads": snakemake.threads})
    log.info("training on %d QA pairs: %s", len(records), cfg)
    curve = train_causal_lm(model, tokenizer, records, template_from(mcfg), cfg, desc=snakemake.wildcards.which)
    save_model(model, tokenizer, snakemake.output.model)
    write_csv(snakemake.output.curve, curve)
