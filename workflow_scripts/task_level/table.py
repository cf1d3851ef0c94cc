"""Rule task_level_table: the paper's task-level table (Method x unrelated / similar / forgotten accuracy)."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.reports.tables import write_table
from qrerase.tracks.task_level.evaluation import task_level_frame
from qrerase.tracks.task_level.tables import task_level_table
from qrerase.workflow.job import job
from qrerase.workflow.naming import method_of

p, out = snakemake.params, snakemake.output
with job(snakemake) as log:
    evals = pd.concat([pd.read_csv(f) for f in snakemake.input.evals], ignore_index=True)
    models = list(p.models)
    frame = task_level_frame(evals.to_dict("records"), models)
    frame["method"] = [method_of(m) for m in models]
    caption = (
        f"Task-level unlearning when removing {p.skills['forget']} (tiny setting): exact-match accuracy on held-out "
        f"questions of the unrelated ({p.skills['unrelated']}), similar ({p.skills['similar']}) and forgotten skill. "
        f"Subspace methods at rank $k={p.rank}$, $\\lambda={p.scale}$. Bold/underlined: best/second-best."
    )
    for wide, key in ((False, "task_level"), (True, "task_level_wide")):
        df, spec = task_level_table(frame, p.skills, wide=wide)
        write_table(
            df,
            spec,
            out[f"{key}_csv"],
            out[f"{key}_md"],
            out[f"{key}_tex"],
            caption=caption,
            label=f"tab:{key}_results",
        )
    write_csv(out.metrics, evals)
    log.info("task table:\n%s", frame.round(4).to_string(index=False))
