"""Rule construction_effect: what each task adapter of a start learned, on its own checkpoint.

For the start's checkpoint without an adapter and with the forget adapter, then with the retain adapter:
the mean answer NLL of the forget and retain training sets (the sets the adapters trained on). The
difference is how far the adapter's training moved them, the size an edit built from it can have."""

import pandas as pd
from peft import PeftModel

from qrerase.config import model_options
from qrerase.io import read_jsonl, write_csv
from qrerase.text.evaluation import EvalConfig, answer_losses
from qrerase.text.lm import qa_pair
from qrerase.text.models import load_model, load_tokenizer
from qrerase.text.tradeoff import mean_answer_nll
from qrerase.workflow.job import job, template_from

p, inp, wc = snakemake.params, snakemake.input, snakemake.wildcards
with job(snakemake, seed=p.seed) as log:
    dtype, device = model_options(p.model)
    source = inp.model if "model" in inp.keys() else p.model["name_or_path"]  # a hub checkpoint: by name
    local = p.model.get("local_files_only", True)
    model = load_model(source, dtype=dtype, device=device, local_files_only=local)
    tokenizer = load_tokenizer(source, local_files_only=local)
    template = template_from(p.model, tokenizer)
    cfg = EvalConfig.from_section(p.evaluate)
    sets = {name: [qa_pair(r) for r in read_jsonl(inp[name])] for name in ("forget", "retain")}

    def nlls(m):
        m.eval()
        return {
            f"{name}_nll": mean_answer_nll(answer_losses(m, tokenizer, template, pairs, cfg))
            for name, pairs in sets.items()
        }

    rows = [{"start": wc.start, "adapter": "none", **nlls(model)}]
    for which in ("forget", "retain"):
        peft_model = PeftModel.from_pretrained(model, inp[f"{which}_adapter"])
        rows.append({"start": wc.start, "adapter": which, **nlls(peft_model)})
        model = peft_model.unload()  # the checkpoint again, without the adapter's layers
        log.info("%s", rows[-1])
    write_csv(snakemake.output[0], pd.DataFrame(rows))
