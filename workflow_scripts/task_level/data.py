"""Rule task_level_data: generate the task-level track's skills (deterministic from the seed) and cut its sets."""

from qrerase.io import write_jsonl
from qrerase.tracks.task_level.data import TaskLevelDataConfig, make_task_level_sets
from qrerase.workflow.job import job

p = snakemake.params
with job(snakemake, seed=p.seed) as log:
    sets = make_task_level_sets(TaskLevelDataConfig.from_dict(p.data), p.seed)
    for name, rows in sets.items():
        write_jsonl(snakemake.output[name], rows)
    log.info("task sets: %s", {name: len(rows) for name, rows in sets.items()})
