"""Rule tofu_metrics: tidy per-model TOFU metrics (one row per metric) from its eval log."""

from qrerase.io import write_csv
from qrerase.metrics.log_metrics import metrics_frame
from qrerase.text.eval_log import load_log
from qrerase.workflow.job import job

with job(snakemake) as log:
    inp, p = snakemake.input, snakemake.params
    reference = load_log(inp.reference) if "reference" in inp.keys() else None
    frame = metrics_frame(load_log(inp.log), reference, model=p.name)
    write_csv(snakemake.output[0], frame)
    log.info("%s: %s", p.name, dict(zip(frame["metric"], frame["value"].round(4))))
