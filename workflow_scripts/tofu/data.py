"""Rule tofu_data: cut the forget / retain / knowledge / evaluation sets of a TOFU run."""

from qrerase.io import write_jsonl
from qrerase.tracks.tofu.data import TofuDataConfig, make_tofu_sets
from qrerase.workflow.job import job

with job(snakemake) as log:
    cfg = TofuDataConfig.from_dict(
        {
            **snakemake.params.data,
            "max_eval_questions": snakemake.params.max_questions,
            "max_forget_questions": snakemake.params.max_forget_questions,
        }
    )
    sets = make_tofu_sets(cfg)
    for name, rows in sets.items():
        if name in snakemake.output.keys():
            write_jsonl(snakemake.output[name], rows)
            log.info("%s: %d records", name, len(rows))
