"""Rule task_level_tradeoff: every sweep point in one table, the λ rule on the held-out slice (never an
evaluation set, never a reference model) and the track's table with each subspace method at its picked λ."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.reports.tables import write_table
from qrerase.text.tradeoff import select_scale
from qrerase.tracks.task_level.evaluation import task_level_frame
from qrerase.tracks.task_level.tables import task_level_table
from qrerase.tracks.task_level.tradeoff import picked_rows
from qrerase.workflow.job import job
from qrerase.workflow.naming import method_of

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    points = pd.concat([pd.read_csv(f) for f in inp.points], ignore_index=True)
    selection = select_scale(points, p.max_rise)  # reads tune_retain_nll only
    points["selected"] = False
    for s in selection.itertuples(index=False):
        hit = (points["method"] == s.method) & (points["rank"] == s.rank) & (points["scale"] == s.selected_scale)
        points.loc[hit, "selected"] = True
    write_csv(out.csv, points)
    write_csv(out.rule_csv, selection)
    # the table at the pick: base and baselines as evaluated by task_level_evaluate, subspace rows at k, picked λ
    at_rank = selection[selection["rank"] == p.rank]
    evals = pd.concat([pd.read_csv(f) for f in inp.evals], ignore_index=True)
    rows = evals.to_dict("records") + picked_rows(points, at_rank, p.skills)
    frame = task_level_frame(rows, p.models)
    frame["method"] = [method_of(m) for m in p.models]
    picks = ", ".join(f"{s.method} {s.selected_scale:g}" for s in at_rank.itertuples(index=False))
    df, spec = task_level_table(frame, p.skills)
    write_table(
        df,
        spec,
        out.picked_csv,
        out.picked_md,
        out.picked_tex,
        caption=(
            f"Task-level unlearning when removing {p.skills['forget']}, subspace methods at rank $k={p.rank}$ and "
            f"the $\\lambda$ picked by the rule (held-out NLL rise $\\le {p.max_rise}$ nats): {picks}."
        ),
        label="tab:task_level_picked",
    )
    log.info(
        "%d points; λ rule (held-out tune_retain NLL rise <= %s):\n%s\n%s",
        len(points),
        p.max_rise,
        selection.to_string(index=False),
        frame.round(4).to_string(index=False),
    )
