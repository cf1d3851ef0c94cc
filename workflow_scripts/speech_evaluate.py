"""Rule speech_evaluate: top-k speaker accuracy of one model on D_t, D_f and D_r of one setting, and
(output 'mia') the LOSS attack's AUC on D_f's training clips against the same speakers' held-out clips
(qrerase.speech.privacy) with the per-clip losses."""

from qrerase.config import model_options
from qrerase.io import write_csv, write_json
from qrerase.speech.data import eval_masks, load_speech_data
from qrerase.speech.model import load_speech_model
from qrerase.speech.privacy import attack_masks, clip_losses, loss_attack_auc
from qrerase.speech.train import evaluate_sets, predict_logits
from qrerase.workflow.job import job

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    arrays, index = load_speech_data(inp.audio, inp.index)
    dtype, device = model_options(p.model)
    model = load_speech_model(inp.model, dtype=dtype, device=device)
    frame = evaluate_sets(model, arrays, eval_masks(index, p.setting), k=p.top_k, batch_size=p.batch_size)
    frame.insert(0, "model", snakemake.wildcards.model)
    frame.insert(0, "setting", p.setting)
    losses = {}
    for name, mask in zip(("members", "nonmembers"), attack_masks(index, p.setting)):
        logits = predict_logits(model, arrays, mask, p.batch_size)
        losses[name] = clip_losses(logits, arrays["labels"][mask]).tolist()
    value = loss_attack_auc(losses["members"], losses["nonmembers"])
    write_csv(snakemake.output.accuracy, frame)
    write_json(
        snakemake.output.mia,
        {
            "setting": p.setting,
            "model": snakemake.wildcards.model,
            "metrics": {"mia_loss": value},
            "member_loss": losses["members"],
            "nonmember_loss": losses["nonmembers"],
        },
    )
    log.info("%s; LOSS attack AUC %.4f", dict(zip(frame["set"], frame["accuracy"].round(4))), value)
