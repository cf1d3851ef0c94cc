"""Rule speech_pretrain: digit recognition (FSDD, 10 classes, all speakers, training split) for the tiny encoder."""

from qrerase.config import model_options
from qrerase.engine import resuming
from qrerase.engine.placement import resolve_device
from qrerase.io import write_csv
from qrerase.text.training import TrainConfig
from qrerase.tracks.speech.data import digit_task, load_speech_data
from qrerase.tracks.speech.model import TinyHubertConfig, build_tiny_hubert, save_speech_model
from qrerase.tracks.speech.train import train_classifier
from qrerase.workflow.job import job, resume_dir
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    arrays, index = load_speech_data(inp.audio, inp.index)
    digits, names = digit_task(arrays, index)
    model = build_tiny_hubert(TinyHubertConfig.from_dict(p.model["tiny"]), names, seed=p.seed)
    model = model.to(resolve_device(model_options(p.model)[1]))
    cfg = TrainConfig.from_dict({**p.train, **p.engine, "seed": p.seed, "threads": snakemake.threads})
    mask = index["split"].to_numpy() == "train"
    log.info("digit pretraining on %d utterances (%d classes): %s", mask.sum(), len(names), cfg)
    curve = train_classifier(model, digits, mask, cfg, desc="pretrain")
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_speech_model(model, out.model)
        write_csv(out.curve, curve)
