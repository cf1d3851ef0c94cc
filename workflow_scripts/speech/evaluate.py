"""Rule speech_evaluate: top-k speaker accuracy of one model on D_t, D_f and D_r of one setting, and
(output 'mia') every registered metric of the speech track (qrerase.tracks.speech.privacy.attack_metrics: the
LOSS attack's AUC on D_f's training clips against the same speakers' held-out clips, and a plug-in's)
with the per-clip losses."""

from qrerase.config import model_options
from qrerase.io import write_csv, write_json
from qrerase.tracks.speech.data import eval_masks, load_speech_data
from qrerase.tracks.speech.model import load_speech_model
from qrerase.tracks.speech.privacy import attack_masks, attack_metrics, clip_losses
from qrerase.tracks.speech.train import evaluate_sets, predict_logits
from qrerase.workflow.job import job

p, inp = snakemake.params, snakemake.input
with job(snakemake, seed=p.seed) as log:
    arrays, index = load_speech_data(inp.audio, inp.index)
    dtype, device = model_options(p.model)
    model = load_speech_model(inp.model, dtype=dtype, device=device)
    frame = evaluate_sets(model, arrays, eval_masks(index, p.setting), k=p.top_k, batch_size=p.batch_size)
    frame.insert(0, "model", snakemake.wildcards.model)
    frame.insert(0, "setting", p.setting)
    losses, clips = {}, {}
    for name, mask in zip(("members", "nonmembers"), attack_masks(index, p.setting)):
        clips[name] = (predict_logits(model, arrays, mask, p.batch_size), arrays["labels"][mask])
        losses[name] = clip_losses(*clips[name]).tolist()
    metrics = attack_metrics(clips["members"], clips["nonmembers"])
    write_csv(snakemake.output.accuracy, frame)
    write_json(
        snakemake.output.mia,
        {
            "setting": p.setting,
            "model": snakemake.wildcards.model,
            "metrics": metrics,
            "member_loss": losses["members"],
            "nonmember_loss": losses["nonmembers"],
        },
    )
    log.info("%s; attack metrics %s", dict(zip(frame["set"], frame["accuracy"].round(4))), metrics)
