"""Rule speech_finetune: train the HuBERT speaker classifier (the "fine-tuned model") on the training split."""

import json

from qrerase.io import write_csv
from qrerase.lm import resolve_device
from qrerase.speech import TinyHubertConfig, build_tiny_hubert, load_speech_data, load_speech_model, save_speech_model, train_classifier
from qrerase.training import TrainConfig
from qrerase.workflow import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output  # noqa: F821
with job(snakemake, seed=p.seed) as log:  # noqa: F821
    arrays, index = load_speech_data(inp.audio, inp.index)
    speakers = json.loads(open(inp.meta, encoding="utf-8").read())["speakers"]
    mcfg = p.model
    if mcfg["name_or_path"] is None:
        model = build_tiny_hubert(TinyHubertConfig.from_dict(mcfg["tiny"]), speakers, seed=p.seed)
        model = model.to(resolve_device(mcfg.get("device", "cpu")))
    else:
        model = load_speech_model(
            mcfg["name_or_path"], speakers, dtype=mcfg.get("dtype", "float32"),
            local_files_only=mcfg.get("local_files_only", True), device=mcfg.get("device", "cpu"), seed=p.seed,
        )
    train = dict(p.train)
    if train.pop("freeze_feature_encoder", False):
        model.freeze_feature_encoder()
    cfg = TrainConfig.from_dict({**train, "seed": p.seed, "threads": snakemake.threads})  # noqa: F821
    mask = index["split"].to_numpy() == "train"
    log.info("training on %d utterances (%d parameters): %s", mask.sum(), sum(x.numel() for x in model.parameters()), cfg)
    curve = train_classifier(model, arrays, mask, cfg, desc="finetune")
    save_speech_model(model, out.model)
    write_csv(out.curve, curve)
