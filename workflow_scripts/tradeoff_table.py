"""Rule track_tradeoff: every sweep point of a text track in one table, the λ selection rule applied
to the held-out retain slice (where the track has one), and the utility–Forget Quality figure."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.registry import method_labels
from qrerase.reports.plots import tradeoff_plot
from qrerase.text.tradeoff import curves, select_scale, tradeoff_frame
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    points = pd.concat([pd.read_csv(f) for f in inp.points], ignore_index=True)
    frame = tradeoff_frame(points)
    selection = select_scale(frame, p.max_rise)
    frame["selected"] = False
    for _, s in selection.iterrows():
        hit = (frame["family"] == "subspace") & (frame["method"] == s["method"]) & (frame["rank"] == s["rank"])
        frame.loc[hit & (frame["scale"] == s["selected_scale"]), "selected"] = True
    write_csv(out.csv, frame)
    write_csv(out.selection, selection)
    tradeoff_plot(
        curves(frame, "forget_quality", "utility_rel", method_labels()),
        out.figure,
        xlabel="Forget Quality (KS p-value, log)",
        ylabel="Model Utility / base model",
        log_x=True,
        xline=0.1,
        xline_label="p = 0.1",
        title=p.title,
    )
    log.info(
        "%d points; λ rule (held-out retain NLL rise <= %s):\n%s",
        len(frame),
        p.max_rise,
        selection.to_string(index=False),
    )
