"""Rule xling_evaluate: TOFU-format eval logs of one model in every configured language (loaded once)."""

from pathlib import Path

from qrerase.text.evaluation import EvalConfig, evaluate_tofu
from qrerase.io import atomic_dir, read_jsonl
from qrerase.text.tofu_log import write_aggregated, write_log
from qrerase.workflow.job import job, load_for_eval, template_from

p = snakemake.params  # noqa: F821
inp = snakemake.input  # noqa: F821
with job(snakemake, seed=p.seed) as log:  # noqa: F821
    adapter = inp.adapter if "adapter" in inp.keys() else None
    model, tokenizer = load_for_eval(inp.model, adapter, p.model)
    cfg = EvalConfig.from_dict({k: v for k, v in p.evaluate.items() if k != "max_questions"})
    with atomic_dir(snakemake.output[0]) as tmp:  # noqa: F821
        for lang in p.languages:
            eval_sets = {s: read_jsonl(inp[f"{lang}:{s}"]) for s in ("forget", "retain", "real_authors", "world_facts")}
            result = evaluate_tofu(model, tokenizer, template_from(p.model, tokenizer), eval_sets, cfg)
            write_log(result, Path(tmp) / lang)
            write_aggregated(result, Path(tmp) / lang / "eval_log_aggregated.json")
            log.info("evaluated %s in %s on %s", snakemake.wildcards.model, lang, {k: len(v) for k, v in eval_sets.items()})  # noqa: F821
