"""Rule task_data: generate the task track's skills (deterministic from the seed) and cut its sets."""

from qrerase.io import write_jsonl
from qrerase.text.task import TaskDataConfig, make_task_sets
from qrerase.workflow.job import job

p = snakemake.params
with job(snakemake, seed=p.seed) as log:
    sets = make_task_sets(TaskDataConfig.from_dict(p.data), p.seed)
    for name, rows in sets.items():
        write_jsonl(snakemake.output[name], rows)
    log.info("task sets: %s", {name: len(rows) for name, rows in sets.items()})
