"""Rule robustness_halves: the seeded A/B split of a text experiment's forget set within each entity
(qrerase.robustness.text.text_halves): A.jsonl (the relearning attack's data), B.jsonl (scored, never
trained on) and, for a track scored in several languages, B_<lang>.jsonl (B's rows of the aligned file)."""

from pathlib import Path

import numpy as np

from qrerase.io import atomic_dir, read_jsonl, write_jsonl
from qrerase.robustness.halves import text_halves
from qrerase.workflow.job import job

inp, p = snakemake.input, snakemake.params
with job(snakemake) as log:  # no torch seeding: the split is seeded explicitly
    forget = read_jsonl(inp.forget)
    in_a = text_halves(forget, p.block, p.seed, p.a_share)
    with atomic_dir(snakemake.output[0]) as tmp:
        write_jsonl(Path(tmp) / "A.jsonl", [forget[i] for i in np.flatnonzero(in_a)])
        write_jsonl(Path(tmp) / "B.jsonl", [forget[i] for i in np.flatnonzero(~in_a)])
        for lang in p.languages:
            rows = read_jsonl(inp[f"forget:{lang}"])
            if len(rows) != len(forget):
                raise ValueError(
                    f"{inp[f'forget:{lang}']}: {len(rows)} rows, expected {len(forget)} (aligned with {inp.forget})"
                )
            write_jsonl(Path(tmp) / f"B_{lang}.jsonl", [rows[i] for i in np.flatnonzero(~in_a)])
    log.info(
        "halves of %d forget rows: A %d, B %d; languages %s",
        len(forget),
        int(in_a.sum()),
        int((~in_a).sum()),
        list(p.languages),
    )
