"""Rule speech_tradeoff_baseline: one baseline at every value of its knob, or the fine-tuned reference ('base')."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.speech.data import load_speech_data, train_mask
from qrerase.speech.model import load_speech_model
from qrerase.speech.tradeoff import SWEEP_COLUMNS, baseline_sweep, evaluate_point, sweep_sets
from qrerase.workflow.job import job

p, inp = snakemake.params, snakemake.input  # noqa: F821
with job(snakemake, seed=p.seed) as log:  # noqa: F821
    method = snakemake.wildcards.method  # noqa: F821
    arrays, index = load_speech_data(inp.audio, inp.index)
    sets = sweep_sets(index, p.setting)

    def evaluate(model):
        return evaluate_point(model, arrays, sets, p.top_k, p.batch_size)

    if method == "base":
        acc = evaluate(load_speech_model(inp.model))
        frame = pd.DataFrame([{"setting": p.setting, "method": "base", "param": "", "value": None, "rank": None, **acc}],
                             columns=SWEEP_COLUMNS)
    else:
        frame = baseline_sweep(
            method, lambda: load_speech_model(inp.model), arrays, train_mask(index, p.setting, "forget"),
            train_mask(index, p.setting, "retain"), {**p.cfg, "seed": p.seed, "threads": snakemake.threads},  # noqa: F821
            p.sweep["param"], p.sweep["values"], evaluate, p.setting, trained=lambda: load_speech_model(inp.trained),
        )
    write_csv(snakemake.output[0], frame)  # noqa: F821
    log.info("%s (%s setting):\n%s", method, p.setting, frame.round(3).to_string(index=False))
