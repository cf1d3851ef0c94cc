"""Rule speech_tradeoff_baseline: one baseline at every value of its knob, or the fine-tuned reference ('base')."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.tracks.speech.data import load_speech_data, train_mask
from qrerase.tracks.speech.model import load_speech_model
from qrerase.tracks.speech.tradeoff import SWEEP_COLUMNS, baseline_sweep, evaluate_point, sweep_sets
from qrerase.workflow.job import job
from qrerase.workflow.launch import is_main_process, load_job

snakemake = load_job()  # the job spec of the rule's shell command (rules/common.smk launch)

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    method = snakemake.wildcards.method
    arrays, index = load_speech_data(inp.audio, inp.index)
    sets = sweep_sets(index, p.setting)

    def evaluate(model):
        return evaluate_point(model, arrays, sets, p.top_k, p.batch_size)

    if method == "base":
        acc = evaluate(load_speech_model(inp.model))
        frame = pd.DataFrame(
            [{"setting": p.setting, "method": "base", "param": "", "value": None, "rank": None, **acc}],
            columns=SWEEP_COLUMNS,
        )
    else:
        frame = baseline_sweep(
            method,
            lambda: load_speech_model(inp.model),
            arrays,
            train_mask(index, p.setting, "forget"),
            train_mask(index, p.setting, "retain"),
            {**p.cfg, **p.engine, "seed": p.seed, "threads": snakemake.threads},
            p.sweep["param"],
            p.sweep["values"],
            evaluate,
            p.setting,
            trained=lambda: load_speech_model(inp.trained),
        )
    if is_main_process():  # rank 0 writes (every rank trained and evaluated alike)
        write_csv(snakemake.output[0], frame)
    log.info("%s (%s setting):\n%s", method, p.setting, frame.round(3).to_string(index=False))
