"""Rule memorisation_probe: the `finetune` recipe on the full training set for max(probe.epochs)
epochs, scored after each probed epoch on the forget set's training answers
(qrerase.text.probe.memorisation_probe); the table marks the smallest epoch meeting probe.min_rouge_l."""

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.text.evaluation import EvalConfig
from qrerase.text.models import load_start
from qrerase.text.probe import memorisation_probe, pick_epochs
from qrerase.text.training import TrainConfig
from qrerase.workflow.job import job, template_from

p = snakemake.params
inp = snakemake.input
with job(snakemake, seed=p.seed) as log:
    settings = p.probe
    if p.train.get("mode", "full") != "full":
        raise ValueError(f"finetune.mode: the probe trains full fine-tunes, got {p.train['mode']!r}")
    dtype, device = model_options(p.model)
    train = {k: v for k, v in p.train.items() if k not in ("mode", "lora")}
    cfg = TrainConfig.from_dict({**train, "seed": p.seed, "threads": snakemake.threads})
    model, tokenizer = load_start(
        {k: inp[k] for k in ("tokenizer", "init") if k in inp.keys()}, p.model, p.seed, dtype, device, False
    )
    template = template_from(p.model, tokenizer)
    records, probe = read_jsonl(inp.data), read_jsonl(inp.forget)
    log.info("probe: %d QA pairs, %s epochs, scored on %d forget QA", len(records), settings["epochs"], len(probe))
    table = memorisation_probe(
        model, tokenizer, records, template, cfg, probe, settings["epochs"], EvalConfig.from_section(p.evaluate)
    )
    pick = pick_epochs(table, settings["min_rouge_l"])
    table["meets"] = table["rouge_l"] >= float(settings["min_rouge_l"])
    table["picked"] = table["epoch"] == pick
    write_csv(snakemake.output[0], table)
    log.info("probe: %s", table.to_dict("records"))
    log.info(
        "picked: %s",
        f"{pick} epochs"
        if pick is not None
        else f"none of {settings['epochs']} reaches ROUGE-L {settings['min_rouge_l']}",
    )
