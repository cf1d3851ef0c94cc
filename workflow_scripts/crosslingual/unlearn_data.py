"""Rule xling_unlearn_data: the forget and retain QA of the unlearning language, for the lora rule."""

from qrerase.io import read_jsonl, write_jsonl
from qrerase.workflow.job import job

with job(snakemake) as log:
    for name in ("forget", "retain"):
        rows = read_jsonl(snakemake.input[name])
        write_jsonl(snakemake.output[name], rows)
        log.info("%s %s: %d records", snakemake.wildcards.exp, name, len(rows))
