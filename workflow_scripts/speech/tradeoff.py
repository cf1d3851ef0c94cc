"""Rule speech_tradeoff: the sweep table, the D_r-against-D_f figure and the lambda rule (held-out slice only)."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.registry import method_labels
from qrerase.tracks.speech.tradeoff import select_scale, tradeoff_plot
from qrerase.workflow.job import job

p, out = snakemake.params, snakemake.output
with job(snakemake) as log:
    frame = pd.concat(
        [pd.read_csv(f, keep_default_na=False, na_values=[""]) for f in snakemake.input.points], ignore_index=True
    )
    base = frame[frame["method"] == "base"]
    sweep = frame[frame["method"] != "base"]
    write_csv(out.csv, frame)
    selected, per_method = select_scale(sweep, base, p.rank, p.rule_methods, p.max_drop)
    write_csv(out.rule_csv, per_method.assign(selected_scale=selected))
    tradeoff_plot(sweep, base, out.figure, rank=p.rank, labels={**method_labels(), "base": "Fine-Tuned Model"})
    log.info(
        "lambda rule (D_v drop <= %s at k=%s): %s\n%s", p.max_drop, p.rank, selected, per_method.to_string(index=False)
    )
