"""Rule xling_data: the multilingual models' training sets and all evaluation text (for the tokenizer)."""

from qrerase.io import read_jsonl, write_jsonl
from qrerase.workflow.job import job

inp, out, p = snakemake.input, snakemake.output, snakemake.params
with job(snakemake) as log:

    def gather(*names):
        return [rec for lang in p.languages for name in names for rec in read_jsonl(inp[f"{lang}:{name}"])]

    sets = {
        "finetune_full": gather("forget", "retain", "knowledge"),
        "finetune_retain": gather("retain", "knowledge"),
        "pretrain": gather("pretrain"),
        **{name: gather(name) for name in ("eval_forget", "eval_retain", "eval_real_authors", "eval_world_facts")},
    }
    for name, rows in sets.items():
        write_jsonl(out[name], rows)
        log.info("%s: %d records over %s", name, len(rows), p.languages)
