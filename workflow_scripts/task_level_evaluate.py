"""Rule task_level_evaluate: exact-match accuracy and answer-token NLL of one model on each role's skill."""

import pandas as pd

from qrerase.io import read_jsonl, write_csv
from qrerase.text.evaluation import EvalConfig
from qrerase.text.task_level_eval import evaluate_skill
from qrerase.workflow.job import job, load_for_eval, template_from

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    model, tokenizer = load_for_eval(inp.model, inp.adapter if "adapter" in inp.keys() else None, p.model)
    cfg = EvalConfig.from_dict(p.evaluate)
    rows = []
    for role, files in p.roles.items():
        records = [r for f in files for r in read_jsonl(inp[f])]
        res = evaluate_skill(model, tokenizer, template_from(p.model), records, cfg)
        rows.append(
            {
                "model": snakemake.wildcards.model,
                "role": role,
                "skill": p.skills[role],
                "n": res["n"],
                "accuracy": res["accuracy"],
                "nll": res["nll"],
            }
        )
        log.info(
            "%s (%s): accuracy %.4f, NLL %.4f; first answers %s",
            role,
            p.skills[role],
            res["accuracy"],
            res["nll"],
            res["generations"][:5],
        )
    write_csv(snakemake.output[0], pd.DataFrame(rows))
