"""Rule task_level_evaluate: exact-match accuracy and answer-token NLL of one model on each role's skill."""

import pandas as pd

from qrerase.io import read_jsonl, write_csv
from qrerase.text.evaluation import EvalConfig
from qrerase.tracks.task_level.evaluation import evaluate_roles
from qrerase.workflow.job import job, load_for_eval, template_from

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    model, tokenizer = load_for_eval(inp.model, inp.adapter if "adapter" in inp.keys() else None, p.model)
    cfg = EvalConfig.from_dict(p.evaluate)
    records = {role: [r for f in files for r in read_jsonl(inp[f])] for role, files in p.roles.items()}
    rows = evaluate_roles(model, tokenizer, template_from(p.model), records, p.skills, cfg, snakemake.wildcards.model)
    for r in rows:
        log.info(
            "%s (%s): accuracy %.4f, NLL %.4f; first answers %s",
            r["role"],
            r["skill"],
            r["accuracy"],
            r["nll"],
            r.pop("generations")[:5],
        )
    write_csv(snakemake.output[0], pd.DataFrame(rows))
