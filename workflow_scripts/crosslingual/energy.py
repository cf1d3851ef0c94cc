"""Rule xling_energy: the task energy of each unlearning language in one table and one overlay figure."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.method.energy import read_selection
from qrerase.reports.plots import energy_overlay_plot
from qrerase.tracks.crosslingual.data import language_label
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    frames = []
    for code, csv in zip(p.unlearn, inp):
        frame = pd.read_csv(csv)
        frame.insert(0, "unlearn", code)
        frames.append(frame)
    energy = pd.concat(frames, ignore_index=True)
    write_csv(out.csv, energy)
    selections = {code: read_selection(csv) for code, csv in zip(p.unlearn, inp)}
    energy_overlay_plot({language_label(c): s.energy for c, s in selections.items()}, out.figure)
    log.info("selected layers per unlearning language: %s", {c: list(s.layers) for c, s in selections.items()})
