"""Rule speech_finetune: the speaker classifier (the "fine-tuned model"), from the pretrained encoder."""

import json

from qrerase.engine import resuming
from qrerase.io import write_csv
from qrerase.text.training import TrainConfig
from qrerase.tracks.speech.data import load_speech_data
from qrerase.tracks.speech.model import load_pretrained, save_speech_model
from qrerase.tracks.speech.train import train_classifier
from qrerase.workflow.job import job, resume_dir
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    arrays, index = load_speech_data(inp.audio, inp.index)
    speakers = json.loads(open(inp.meta, encoding="utf-8").read())["speakers"]
    # the pretrained model (digit-pretrained here, or the hub checkpoint) with a new, seeded speaker head
    model = load_pretrained(p.model, inp.get("pretrained"), speakers, seed=p.seed)
    source = getattr(model.config, "source", None)  # an encoder taken out of a larger checkpoint (Qwen3-Omni)
    if source:  # saved with the model's config.json, which the job's provenance record hashes
        log.info(
            "encoder: %d tensors %s* of %s (shards %s)",
            len(source["tensors"]),
            source["prefix"],
            source["checkpoint"],
            source["shards"],
        )
    train = {**p.train, **p.engine}  # engine: the settings the memory plan planned
    if train.pop("freeze_feature_encoder", False):
        model.freeze_feature_encoder()
    cfg = TrainConfig.from_dict({**train, "seed": p.seed, "threads": snakemake.threads})
    mask = index["split"].to_numpy() == "train"
    log.info(
        "training on %d utterances (%d parameters): %s", mask.sum(), sum(x.numel() for x in model.parameters()), cfg
    )
    curve = train_classifier(model, arrays, mask, cfg, desc="finetune")
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_speech_model(model, out.model)
        write_csv(out.curve, curve)
