"""Rule speech_lora: LoRA on the attention projections (from speech.lora.base), on D_f (train) or D_r."""

from qrerase.engine import resuming
from qrerase.io import write_csv
from qrerase.method.architectures import resolve_target_modules
from qrerase.text.training import ENGINE_KEYS, LoraTrainConfig, TrainConfig, save_adapter
from qrerase.tracks.speech.architectures import speech_lora_targets
from qrerase.tracks.speech.data import load_speech_data, train_mask
from qrerase.tracks.speech.model import graft_encoder, load_pretrained, load_speech_model
from qrerase.tracks.speech.train import train_speech_lora
from qrerase.workflow.job import job, resume_dir
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    lcfg, which = {**p.lora, **p.engine}, snakemake.wildcards.set  # engine: the memory plan's settings
    arrays, index = load_speech_data(inp.audio, inp.index)
    model = load_speech_model(inp.model)
    if lcfg.get("base", "finetuned") == "pretrained":  # the pretrained encoder carrying the fine-tuned speaker head
        graft_encoder(model, load_pretrained(p.model, inp.get("pretrained")))
        log.info("LoRA base: the pretrained encoder with the fine-tuned speaker head")
    train_keys = ("epochs", "lr", "batch_size", "weight_decay", "warmup_ratio", *ENGINE_KEYS)
    cfg = LoraTrainConfig(
        r=lcfg["r"],
        alpha=lcfg["alpha"],
        dropout=lcfg.get("dropout", 0.0),
        target_modules=tuple(
            resolve_target_modules(  # auto: the family's declared targets
                model, speech_lora_targets(model.config.to_dict(), lcfg["target_modules"]), "speech.lora.target_modules"
            )
        ),
        train=TrainConfig.from_dict(
            {**{k: lcfg[k] for k in train_keys if k in lcfg}, "seed": p.seed, "threads": snakemake.threads}
        ),
    )
    mask = train_mask(index, p.setting, which)
    log.info("LoRA (%s setting, %s set) on %d utterances: %s", p.setting, which, mask.sum(), cfg)
    peft_model, curve = train_speech_lora(model, arrays, mask, cfg, desc=f"lora-{which}")
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_adapter(peft_model, out.adapter)
        write_csv(out.curve, curve)
