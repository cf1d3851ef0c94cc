"""Rule speech_baseline: Gradient Ascent, SCRUB or Bad Teaching from the fine-tuned speaker classifier."""

from qrerase.engine import resuming
from qrerase.io import write_csv
from qrerase.tracks.speech.baselines import SpeechBaselineConfig, run_baseline
from qrerase.tracks.speech.data import load_speech_data, train_mask
from qrerase.tracks.speech.model import load_speech_model, save_speech_model
from qrerase.workflow.job import job, resume_dir
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake, seed=p.seed) as log, resuming(resume_dir(snakemake)):
    method = snakemake.wildcards.method
    arrays, index = load_speech_data(inp.audio, inp.index)
    model = load_speech_model(inp.model)
    settings = {**p.cfg, **p.engine, "method": method, "seed": p.seed, "threads": snakemake.threads}
    cfg = SpeechBaselineConfig.from_dict(settings)
    forget, retain = train_mask(index, p.setting, "forget"), train_mask(index, p.setting, "retain")
    log.info(
        "%s (%s setting): %d forget / %d retain utterances: %s", method, p.setting, forget.sum(), retain.sum(), cfg
    )
    model, curve = run_baseline(method, model, arrays, forget, retain, cfg)
    if is_main_process():  # rank 0 writes: it holds the full trained weights (on its CPU after FSDP2)
        save_speech_model(model, out.model)
        write_csv(out.curve, curve)
