"""Rule speech_rank: rank k vs reconstruction error (top) and D_f / D_r accuracy (bottom), CPQR and SVD."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.tracks.speech.tables import rank_curve, rank_plot
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    ranks, curves, base, frames = list(p.ranks), {}, {}, []
    evals = pd.concat([pd.read_csv(f) for f in inp.evals], ignore_index=True)
    for i, setting in enumerate(p.settings):
        reports = {k: pd.read_csv(inp.reports[i * len(ranks) + j]) for j, k in enumerate(ranks)}
        curve = rank_curve(reports, evals[evals["setting"] == setting])
        curves[setting] = curve
        b = pd.read_csv(inp.base[i])
        base[setting] = dict(zip(b["set"], b["accuracy"]))
        frames.append(curve.assign(setting=setting))
    table = pd.concat(frames, ignore_index=True)[["setting", "rank", "decomp", "recon_error", "D_f", "D_r"]]
    write_csv(out.csv, table)
    rank_plot(curves, out.figure, selected_rank=p.selected_rank, base=base)
    log.info("rank curve:\n%s", table.to_string(index=False))
