"""Rule tofu_holdout: the question / answer pairs of the TOFU holdout authors matching the forget set
(qrerase.tracks.tofu.data.make_holdout_set), the non-members of the membership-inference metrics."""

from qrerase.io import write_jsonl
from qrerase.tracks.tofu.data import TofuDataConfig, make_holdout_set
from qrerase.workflow.job import job

with job(snakemake) as log:
    cfg = TofuDataConfig.from_dict(
        {
            **snakemake.params.data,
            "max_eval_questions": snakemake.params.max_questions,
            "max_forget_questions": snakemake.params.max_forget_questions,
        }
    )
    rows = make_holdout_set(cfg)
    write_jsonl(snakemake.output[0], rows)
    log.info("eval_holdout: %d records", len(rows))
