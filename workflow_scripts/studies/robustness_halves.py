"""Rule robustness_halves: the seeded A/B split of a text experiment's forget set within each entity
(qrerase.robustness.halves.text_halves): A.jsonl (the relearning attack's data), B.jsonl (scored, never
trained on), each row with its entity and, where the track has them, its paraphrased question, and, for a
track scored in several languages, B_<lang>.jsonl (B's rows of the aligned file)."""

from pathlib import Path

import numpy as np

from qrerase.io import atomic_dir, read_jsonl, write_jsonl
from qrerase.robustness.halves import entities_in_blocks, text_halves, with_paraphrases
from qrerase.workflow.job import job

inp, p = snakemake.input, snakemake.params
with job(snakemake) as log:  # no torch seeding: the split is seeded explicitly
    forget = read_jsonl(inp.forget)
    in_a = text_halves(forget, p.block, p.seed, p.a_share)
    # each row's entity (the in-context attack's facts come from B's own entity) and, where the track has
    # them, its paraphrased question (the paraphrase attack)
    entity = entities_in_blocks(len(forget), p.block)
    forget = [{**r, "entity": e} for r, e in zip(forget, entity)]
    if "paraphrases" in inp.keys():
        forget = with_paraphrases(forget, read_jsonl(inp.paraphrases), inp.paraphrases)
    with atomic_dir(snakemake.output[0]) as tmp:
        write_jsonl(Path(tmp) / "A.jsonl", [forget[i] for i in np.flatnonzero(in_a)])
        write_jsonl(Path(tmp) / "B.jsonl", [forget[i] for i in np.flatnonzero(~in_a)])
        for lang in p.languages:
            rows = read_jsonl(inp[f"forget:{lang}"])
            if len(rows) != len(forget):
                raise ValueError(
                    f"{inp[f'forget:{lang}']}: {len(rows)} rows, expected {len(forget)} (aligned with {inp.forget})"
                )
            write_jsonl(
                Path(tmp) / f"B_{lang}.jsonl", [{**rows[i], "entity": entity[i]} for i in np.flatnonzero(~in_a)]
            )
    log.info(
        "halves of %d forget rows: A %d, B %d; languages %s",
        len(forget),
        int(in_a.sum()),
        int((~in_a).sum()),
        list(p.languages),
    )
