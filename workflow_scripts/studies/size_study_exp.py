"""Rule size_study_exp: one size-study experiment's rows (per method: selectivity, the λ rule's pick
and its Forget Quality / utility), its mechanistic measures (principal angles, effective layers) and
the attack AUCs of its fine-tuned model and retain reference (input 'sequence': their eval folders)."""

from pathlib import Path

import pandas as pd
from safetensors import safe_open

from qrerase.io import write_csv
from qrerase.method.energy import read_selection
from qrerase.method.formats import load_decompositions
from qrerase.method.separability import layer_overlap
from qrerase.metrics.rows import load_sequence_metrics
from qrerase.reports.size_study import exp_rows, mechanistic_row, privacy_row
from qrerase.text.tradeoff import share_unedited
from qrerase.workflow.job import job
from qrerase.workflow.naming import size_of

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    width, seed = size_of(snakemake.wildcards.exp)
    n_params = 0
    for f in sorted(Path(inp.model).glob("*.safetensors")):
        with safe_open(str(f), framework="numpy") as fh:
            for key in fh.keys():
                n = 1
                for d in fh.get_slice(key).get_shape():
                    n *= d
                n_params += n
    if n_params == 0:
        raise ValueError(f"{inp.model}: no safetensors weights to count")
    points = pd.concat([pd.read_csv(f) for f in inp.points], ignore_index=True)
    points = share_unedited(points, p.sweeps)  # the λ = 0 point, evaluated once
    rows = exp_rows(points, width=width, seed=seed, n_params=n_params, target=p.target, max_rise=p.max_rise)
    layers = layer_overlap(load_decompositions(inp.forget), load_decompositions(inp.retain))
    mech = mechanistic_row(layers, read_selection(inp.energy).energy)
    sequence = {
        m: load_sequence_metrics(Path(d) / "sequence_metrics.json") for m, d in zip(("base", "retain"), inp.sequence)
    }
    for key, value in {**mech, **privacy_row(sequence)}.items():
        rows[key] = value
    write_csv(out.rows, rows)
    write_csv(out.layers, pd.DataFrame(layers).assign(width=width, seed=seed))
    log.info("width %d seed %d (%d parameters):\n%s", width, seed, n_params, rows.to_string(index=False))
