"""Rule robustness_text: every attack of the robustness stage on one text model (docs/robustness.md):
relearning on half A of the forget set and benign fine-tuning on the retain set (full and LoRA, each
budget), the prompt attacks on half B (paraphrased questions, an affirmative answer prefix, in-context
facts of half A), GGUF and bitsandbytes quantization, and the subspace diagnostic of the relearning update."""

from pathlib import Path

import pandas as pd

from qrerase.io import read_jsonl, write_csv
from qrerase.method.architectures import resolve_target_modules
from qrerase.method.energy import selected_updates
from qrerase.method.erase import apply_updates
from qrerase.method.formats import load_updates
from qrerase.robustness.runner import ROW_COLUMNS, SUBSPACE_COLUMNS, diagnostic_bases, run_attacks, subspace_rows
from qrerase.robustness.settings import robustness_settings
from qrerase.robustness.text import PromptSetup, attacked_model, entity_facts, linear_weights, rule_scale, text_target
from qrerase.text.evaluation import EvalConfig
from qrerase.text.training import LoraTrainConfig
from qrerase.workflow.job import job, load_for_eval, template_from

inp, p = snakemake.input, snakemake.params
j = p.job  # the track's plan for this job (rules/studies/robustness.smk robustness_params)
with job(snakemake, seed=p.seed) as log:
    settings = robustness_settings(p.settings)
    model, tokenizer = load_for_eval(inp.model, inp.adapter if "adapter" in inp.keys() else None, p.model)
    model = attacked_model(model)  # an erase adapter: its merged weights
    if "selection" in inp.keys():  # a '_rule' model: the fine-tuned weights, erased at the lambda rule's pick
        scale = rule_scale(inp.selection, j["rule"]["method"], j["rule"]["rank"])
        updates = selected_updates(load_updates(inp.tilde), inp.selected if "selected" in inp.keys() else None)
        apply_updates(model, {m: (u.U * (scale / j["scale"]), u.V) for m, u in updates.items()})
        log.info(
            "%s at the lambda rule's pick: lambda %g (the update file's: %g)", j["rule"]["method"], scale, j["scale"]
        )
    template = template_from(p.model, tokenizer)
    halves = Path(inp.halves)
    half_a, half_b = read_jsonl(halves / "A.jsonl"), read_jsonl(halves / "B.jsonl")
    scored = {"B": half_b, "forget": half_a + half_b}
    for lang in j["languages"]:  # B's questions in another language
        scored[f"B:{lang}"] = read_jsonl(halves / f"B_{lang}.jsonl")
    scored["utility"] = read_jsonl(inp.utility)[: settings.utility_questions]
    training = {"A": half_a, "retain": read_jsonl(inp.retain)}
    shape = dict(j["lora_shape"])
    shape["target_modules"] = resolve_target_modules(
        model, shape["target_modules"]
    )  # 'auto': the architecture's preset
    lora = LoraTrainConfig.from_dict(
        {
            **shape,
            "train": {"epochs": 1, "lr": j["rates"]["lora"][0], "batch_size": 1, "seed": p.seed, "threads": p.threads},
        }
    )
    attacks = [a for a in settings.prompt_attacks if a in j["prompt_attacks"]]  # those the track's data allow
    prompts = PromptSetup(
        attacks=attacks,
        prefix=settings.prefix,
        grid=settings.in_context,
        paraphrases=[r["paraphrased_question"] for r in half_b] if "paraphrase" in attacks else None,
        facts=entity_facts(half_a, half_b),
        context=getattr(model.config, "max_position_embeddings", None),
    )
    target = text_target(
        tokenizer,
        template,
        scored,
        training,
        EvalConfig.from_dict(j["evaluate"]),
        j["rates"],
        j["max_length"],
        lora_cfg=lora if "lora" in settings.modes else None,
        prompts=prompts if attacks else None,
    )
    ceiling, _ = load_for_eval(inp.ceiling, None, p.model)
    ceiling_w = {n: w.detach().cpu().float().numpy() for n, w in linear_weights(ceiling).items()}
    del ceiling
    bases = diagnostic_bases(dict(inp.items()))
    log.info(
        "halves: A %d, B %d questions; scored sets %s", len(half_a), len(half_b), {k: len(v) for k, v in scored.items()}
    )
    rows, delta = run_attacks(model, target, settings, p.seed, p.threads, ceiling_w, list(bases["task"]), log.info)
    sub = subspace_rows(delta, bases, j["rank"], p.seed)
    write_csv(snakemake.output.rows, pd.DataFrame(rows, columns=ROW_COLUMNS))
    write_csv(snakemake.output.subspace, pd.DataFrame(sub, columns=SUBSPACE_COLUMNS))
