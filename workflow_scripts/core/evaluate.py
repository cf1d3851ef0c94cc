"""Rules evaluate and xling_evaluate: TOFU-format eval logs (four files + aggregated) of one model,
loaded once: one log in the output folder (evaluate), or one per configured language in
<output>/<lang>/ (xling_evaluate: params.languages, inputs '<lang>:<set>').

Rule evaluate (input 'holdout') also writes sequence_metrics.json: every registered metric of its track
(params.track) with a per-sequence statistic (qrerase.metrics.registry, aggregates 'auc' and 'mean'; those
of the config's `plugins` too, imported by job()) of the forget-set and holdout answers and their values
(qrerase.metrics.scoring.track_sequence_metrics)."""

from pathlib import Path

from qrerase.io import atomic_dir, read_jsonl, write_json
from qrerase.metrics.scoring import track_sequence_metrics
from qrerase.text.eval_log import EVAL_SETS, write_aggregated, write_log
from qrerase.text.evaluation import EvalConfig, evaluate_log
from qrerase.workflow.job import job, load_for_eval, template_from

p = snakemake.params
inp = snakemake.input
with job(snakemake, seed=p.seed) as log:
    adapter = inp.adapter if "adapter" in inp.keys() else None
    model, tokenizer = load_for_eval(inp.model, adapter, p.model)
    cfg = EvalConfig.from_section(p.evaluate)
    languages = p.get("languages")
    with atomic_dir(snakemake.output[0]) as tmp:
        for lang in languages or [None]:
            eval_sets = {s: read_jsonl(inp[s if lang is None else f"{lang}:{s}"]) for s in EVAL_SETS}
            template = template_from(p.model, tokenizer)
            result = evaluate_log(model, tokenizer, template, eval_sets, cfg)
            folder = Path(tmp) if lang is None else Path(tmp) / lang
            write_log(result, folder)
            write_aggregated(result, folder / "eval_log_aggregated.json")
            where = "" if lang is None else f" in {lang}"
            log.info(
                "evaluated %s%s on %s", snakemake.wildcards.model, where, {k: len(v) for k, v in eval_sets.items()}
            )
        if "holdout" in inp.keys():
            holdout = read_jsonl(inp.holdout)
            result = track_sequence_metrics(model, tokenizer, template, eval_sets["forget"], holdout, cfg, p.track)
            write_json(Path(tmp) / "sequence_metrics.json", result)
            values = result["metrics"]
            log.info("sequence metrics (forget vs holdout): %s", {k: round(v, 4) for k, v in values.items()})
