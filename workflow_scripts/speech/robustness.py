"""Rule robustness_speech: every attack of the robustness stage on one speaker classifier of a speech
setting (docs/robustness.md): relearning on half A of the forget set and benign fine-tuning on the retain
set (full and LoRA, each budget), GGUF quantization, and the subspace diagnostic of the relearning
update. The floor, the retain reference, is trained here first (qrerase.tracks.speech.robustness)."""

import json

import pandas as pd

from qrerase.config import model_options
from qrerase.io import write_csv
from qrerase.method.architectures import resolve_target_modules
from qrerase.robustness.runner import ROW_COLUMNS, SUBSPACE_COLUMNS, diagnostic_bases, run_attacks, subspace_rows
from qrerase.robustness.settings import robustness_settings
from qrerase.robustness.text import linear_weights
from qrerase.text.training import LoraTrainConfig
from qrerase.tracks.speech.architectures import speech_lora_targets
from qrerase.tracks.speech.data import load_speech_data
from qrerase.tracks.speech.model import load_speech_model
from qrerase.tracks.speech.robustness import retain_reference, speech_sets, speech_target
from qrerase.workflow.job import job

inp, p = snakemake.input, snakemake.params
with job(snakemake, seed=p.seed) as log:
    j = p.job
    settings = robustness_settings(p.settings)
    arrays, index = load_speech_data(inp.audio, inp.index)
    dtype, device = model_options(p.model)
    if "reference" in j:  # the floor: the fine-tuned classifier's recipe on the retain set only
        speakers = json.loads(open(inp.meta, encoding="utf-8").read())["speakers"]
        model, curve = retain_reference(
            p.model, inp.get("pretrained"), speakers, arrays, index, j["setting"], j["reference"], p.seed, p.threads
        )
        log.info("retain reference: %d steps, final loss %.4f", len(curve), curve["loss"].iloc[-1])
    else:
        model = load_speech_model(inp.model, dtype=dtype, device=device)
    scored, training = speech_sets(index, j["setting"], p.seed, settings.a_share)
    lora = None
    if "lora" in settings.modes:
        shape = j["lora_shape"]
        targets = resolve_target_modules(
            model, speech_lora_targets(model.config.to_dict(), shape["target_modules"]), "speech.lora.target_modules"
        )
        lora = LoraTrainConfig.from_dict(
            {
                **shape,
                "target_modules": targets,
                "train": {
                    "epochs": 1,
                    "lr": j["rates"]["lora"][0],
                    "batch_size": 1,
                    "seed": p.seed,
                    "threads": p.threads,
                },
            }
        )
    target = speech_target(
        arrays, scored, training, j["rates"], lora, j["evaluate"]["batch_size"], j["evaluate"]["top_k"]
    )
    ceiling = load_speech_model(inp.ceiling, dtype=dtype, device=device)
    ceiling_w = {n: w.detach().float().cpu().numpy() for n, w in linear_weights(ceiling).items()}
    del ceiling
    bases = diagnostic_bases(dict(inp.items()))
    missing = sorted(set(bases["task"]) - set(ceiling_w))
    if missing:
        raise ValueError(f"{inp.task}: module {missing[0]!r} is no linear layer of the classifier")
    log.info(
        "%s setting: A %d, retain %d clips; scored %s",
        j["setting"],
        *(len(training[s]) for s in ("A", "retain")),
        {k: len(v) for k, v in scored.items()},
    )
    rows, delta = run_attacks(model, target, settings, p.seed, p.threads, ceiling_w, list(bases["task"]), log.info)
    sub = subspace_rows(delta, bases, j["rank"], p.seed)
    write_csv(snakemake.output.rows, pd.DataFrame(rows, columns=ROW_COLUMNS))
    write_csv(snakemake.output.subspace, pd.DataFrame(sub, columns=SUBSPACE_COLUMNS))
