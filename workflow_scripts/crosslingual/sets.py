"""Rule xling_sets: one language's training QA and evaluation sets (row-aligned across languages)."""

from qrerase.io import write_jsonl
from qrerase.tracks.crosslingual.data import make_language_sets
from qrerase.workflow.job import job

p = snakemake.params
with job(snakemake) as log:
    sets = make_language_sets(
        p.root,
        p.data["n_authors"],
        p.max_questions,
        p.data.get("knowledge", []),
        p.data.get("knowledge_questions"),
        p.data.get("forget_split", "forget01_perturbed"),
        p.data.get("pretrain_authors", 0),
    )
    for name in snakemake.output.keys():
        write_jsonl(snakemake.output[name], sets[name])
        log.info("%s %s: %d records", snakemake.wildcards.lang, name, len(sets[name]))
