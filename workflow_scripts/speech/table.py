"""Rule speech_table: the paper's speech table (method rows; D_t, D_f, D_r under Sample and Class)."""

import pandas as pd

from qrerase.reports.tables import write_table
from qrerase.tracks.speech.tables import SETTING_LABELS, speech_table
from qrerase.workflow.job import job
from qrerase.workflow.naming import method_of

p, out = snakemake.params, snakemake.output
with job(snakemake) as log:
    evals = pd.concat([pd.read_csv(f) for f in snakemake.input.evals], ignore_index=True)
    models = list(p.models)
    df, spec = speech_table(evals, p.settings, models, row_key=method_of)
    caption = (
        f"Speaker-identification unlearning on FSDD ({', '.join(SETTING_LABELS[s] for s in p.settings)}): "
        f"top-{p.top_k} accuracy (\\%) on $D_t$ (held-out test), $D_f$ (forget) and $D_r$ (retain). "
        "Subspace methods at rank "
        f"$k={p.rank}$. Bold/underlined: best/second-best."
    )
    write_table(df, spec, out.csv, out.md, out.tex, caption=caption, label="tab:speech_results", environment="table*")
    log.info("speech table:\n%s", df.round(1).to_string(index=False))
