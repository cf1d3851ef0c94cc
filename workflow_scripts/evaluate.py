"""Rule evaluate: a TOFU-format eval log (four files + aggregated) for one model."""

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
    eval_sets = {name: read_jsonl(inp[name]) for name in ("forget", "retain", "real_authors", "world_facts")}
    cfg = EvalConfig(
        batch_size=p.evaluate.get("batch_size", 32),
        max_new_tokens=p.evaluate.get("max_new_tokens", 48),
    )
    result = evaluate_tofu(model, tokenizer, template_from(p.model, tokenizer), eval_sets, cfg)
    with atomic_dir(snakemake.output[0]) as tmp:  # noqa: F821
        write_log(result, tmp)
        write_aggregated(result, Path(tmp) / "eval_log_aggregated.json")
    log.info("evaluated %s on %s", snakemake.wildcards.model, {k: len(v) for k, v in eval_sets.items()})
