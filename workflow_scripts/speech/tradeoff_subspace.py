"""Rule speech_tradeoff_subspace: one subspace method at every (k, lambda), erased in-process from the factors."""

from qrerase.io import write_csv
from qrerase.method.energy import selected_updates
from qrerase.method.formats import load_decompositions
from qrerase.tracks.speech.data import load_speech_data
from qrerase.tracks.speech.model import load_speech_model
from qrerase.tracks.speech.tradeoff import evaluate_point, subspace_sweep, sweep_sets
from qrerase.workflow.job import job

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    method = snakemake.wildcards.method
    arrays, index = load_speech_data(inp.audio, inp.index)
    sets = sweep_sets(index, p.setting)
    factors = {k: (load_decompositions(inp[f"forget_k{k}"]), load_decompositions(inp[f"retain_k{k}"])) for k in p.ranks}
    first = factors[p.ranks[0]][0]
    modules = list(selected_updates(first, inp.get("selected")))
    model = load_speech_model(inp.model)
    frame = subspace_sweep(
        model,
        factors,
        p.scales,
        lambda m: evaluate_point(m, arrays, sets, p.top_k, p.batch_size),
        p.setting,
        method,
        modules=modules,
        retain_rank=p.retain_rank,
    )
    write_csv(snakemake.output[0], frame)
    log.info("%s (%s setting), %d modules:\n%s", method, p.setting, len(modules), frame.round(3).to_string(index=False))
