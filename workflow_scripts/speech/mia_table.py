"""Rule speech_mia_table: the speech track's registered metrics (the LOSS attack's AUC of D_f's training
clips vs the same speakers' held-out clips, and a plug-in's) of every speech-table model per setting,
from the 'mia' outputs of rule speech_evaluate."""

import json
from pathlib import Path

from qrerase.reports.tables import write_table
from qrerase.tracks.speech.tables import speech_mia_table
from qrerase.workflow.job import job
from qrerase.workflow.naming import method_of

p, out = snakemake.params, snakemake.output
with job(snakemake) as log:
    values = {}
    for f in snakemake.input.mia:
        try:
            record = json.loads(Path(f).read_text(encoding="utf-8"))
            values[(record["setting"], record["model"])] = {k: float(v) for k, v in record["metrics"].items()}
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{f}: not a speech attack record ({exc})") from None
    df, spec = speech_mia_table(values, p.settings, list(p.models), row_key=method_of)
    write_table(df, spec, out.csv, out.md, None)
    log.info("speech attack metrics:\n%s", df.round(4).to_string(index=False))
