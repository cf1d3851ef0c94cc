"""Rule speech_evaluate: top-k speaker accuracy of one model on D_t, D_f and D_r of one setting."""

from qrerase.config import model_options
from qrerase.io import write_csv
from qrerase.speech.data import eval_masks, load_speech_data
from qrerase.speech.model import load_speech_model
from qrerase.speech.train import evaluate_sets
from qrerase.workflow.job import job

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    arrays, index = load_speech_data(inp.audio, inp.index)
    dtype, device = model_options(p.model)
    model = load_speech_model(inp.model, dtype=dtype, device=device)
    frame = evaluate_sets(model, arrays, eval_masks(index, p.setting), k=p.top_k, batch_size=p.batch_size)
    frame.insert(0, "model", snakemake.wildcards.model)
    frame.insert(0, "setting", p.setting)
    write_csv(snakemake.output[0], frame)
    log.info("%s", dict(zip(frame["set"], frame["accuracy"].round(4))))
