"""Rule track_tradeoff: every sweep point of a text track in one table, the λ selection rule applied
to the held-out slice (where the track has one), each method's selectivity at the target
held-out rise, and the figure: utility against Forget Quality (protocol tofu), or the forget-set NLL
rise against the held-out retain NLL rise (protocol nll)."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.metrics.log_metrics import FORGET_QUALITY_THRESHOLD
from qrerase.registry import method_labels
from qrerase.reports.plots import tradeoff_plot
from qrerase.reports.size_study import sweep_rows
from qrerase.text.tradeoff import curves, nll_rises, select_scale, share_unedited, tradeoff_frame
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    points = pd.concat([pd.read_csv(f) for f in inp.points], ignore_index=True)
    frame = tradeoff_frame(share_unedited(points, p.sweeps))  # the λ = 0 point, evaluated once
    selection = select_scale(frame, p.max_rise)
    frame["selected"] = False
    for _, s in selection.iterrows():
        hit = (frame["family"] == "subspace") & (frame["method"] == s["method"]) & (frame["rank"] == s["rank"])
        frame.loc[hit & (frame["scale"] == s["selected_scale"]), "selected"] = True
    write_csv(out.csv, frame)
    write_csv(out.selection, selection)
    if frame["tune_retain_nll"].notna().any():  # TOFU: the held-out slice; cross-lingual has none
        # the subspace sweeps at unlearn.rank (else the first swept k), every baseline sweep
        ranks = list(frame.loc[frame["family"] == "subspace", "rank"].dropna().unique())
        k = p.rank if p.rank in ranks else ranks[0]
        at_k = frame[(frame["family"] != "subspace") | (frame["rank"] == k)]
        selectivity = pd.concat(
            [
                sweep_rows(grp, target=p.target, max_rise=p.max_rise).assign(group=group, rank=k)
                for group, grp in at_k.groupby("group", sort=False)
            ],
            ignore_index=True,
        )
    else:
        selectivity = pd.DataFrame(columns=["group", "method", "family", "x_star", "selectivity", "picked"])
    write_csv(out.selectivity, selectivity)
    if p.protocol == "nll":
        rises = nll_rises(frame)
        tradeoff_plot(
            curves(rises, "tune_retain_rise", "forget_rise", method_labels()),
            out.figure,
            xlabel="held-out retain answer NLL rise (nats)",
            ylabel="forget-set answer NLL rise (nats)",
            xline=p.target,
            xline_label=f"held-out rise {p.target:g}",
            title=p.title,
        )
    else:
        tradeoff_plot(
            curves(frame, "forget_quality", "utility_rel", method_labels()),
            out.figure,
            xlabel="Forget Quality (KS p-value, log)",
            ylabel="Model Utility / base model",
            log_x=True,
            xline=FORGET_QUALITY_THRESHOLD,
            xline_label=f"p = {FORGET_QUALITY_THRESHOLD:g}",
            title=p.title,
        )
    log.info(
        "%d points; λ rule (held-out retain NLL rise <= %s):\n%s\nselectivity at a %s-nat held-out rise:\n%s",
        len(frame),
        p.max_rise,
        selection.to_string(index=False),
        p.target,
        selectivity.to_string(index=False),
    )
