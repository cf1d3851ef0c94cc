"""Rule robustness_table: a track's robustness tables (recovery per model, attack and budget; the subspace
diagnostic) and its two figures, from the per-model rows of rule robustness_text / robustness_speech."""

import pandas as pd

from qrerase.io import write_csv, write_text
from qrerase.registry import method_labels
from qrerase.robustness.table import recovery_figure, recovery_frame, subspace_figure, subspace_frame, summary_markdown
from qrerase.workflow.job import job

p, inp, out = snakemake.params, snakemake.input, snakemake.output
track = snakemake.wildcards.track
with job(snakemake) as log:
    plan = p.plan
    names = method_labels()
    labels = {"base": "Fine-tuned (ceiling)", "retain": "Retain reference (floor)", "init": "Initial model (floor)"}
    for m in plan["models"]:  # '<method>_k<rank>' and '<method>_k<rank>_rule' by their method's label
        head, _, tail = m.partition("_k")
        if head in names:
            labels.setdefault(m, names[head] + (" (λ rule)" if tail.endswith("_rule") else ""))
    long, subs, parts = [], [], []
    for exp in plan["exps"]:
        rows = pd.concat(
            [
                pd.read_csv(inp[f"{exp}:{m}"], keep_default_na=False, na_values=[""]).assign(model=m)
                for m in plan["models"]
            ]
        )
        frame = recovery_frame(rows, plan["ceiling"], plan["floor"], plan["models"])
        long.append(frame.assign(exp=exp))
        sub = pd.concat([pd.read_csv(inp[f"{exp}:{m}_subspace"]).assign(model=m) for m in plan["models"]])
        spans = {m: m.removesuffix("_rule") for m in plan["models"]}  # a λ-rule model: its method's span
        table = subspace_frame(sub, plan["models"], plan["ceiling"], spans)
        subs.append(table.assign(exp=exp))
        parts.append((exp, frame, table))
    frame = pd.concat(long, ignore_index=True)
    write_csv(out.table_csv, frame[["exp", *frame.columns[:-1]]])
    subspace = pd.concat(subs, ignore_index=True)
    write_csv(out.subspace_csv, subspace[["exp", *subspace.columns[:-1]]])
    md, smd = [], []
    floors = {"retain": "the retain reference", "init": "the model fine-tuning started from"}
    floor = floors.get(plan["floor"], plan["floor"]) if plan["floor"] else "none (recoveries empty)"
    about = (
        f"Recovery = (attacked − floor) / (ceiling − floor) on the forget statistic ({plan['statistic']}); ceiling: "
        f"the fine-tuned model, floor: {floor}, each under the same attack (quantization: the same round trip; "
        "a prompt attack: the same prompts, scored on B).\n\n"
    )
    where = (
        "Share of the relearning update ΔW (full parameters, the largest lr factor and budget) in the erased "
        "subspace span(Q̃_f) (erased), the same span for the fine-tuned model's own update under the same "
        "attack (ceiling), the forget (task) and retain (retain, the control) task matrices' top-k left singular "
        "vectors, and a random k-dimensional subspace (the reference, k/d_out in expectation); every row of a "
        "model over the same modules (an LL method's: those it edits).\n\n"
    )
    for exp, f, table in parts:
        md.append(f"### {exp}\n\n" + about + summary_markdown(f, plan["models"], labels, plan["statistic"]))
        t = table.copy()
        t["model"] = [labels.get(m, m) for m in t["model"]]
        smd.append(f"### {exp}\n\n" + where + t.to_markdown(index=False, floatfmt=".4f") + "\n")
    at = " at the λ rule's pick" if plan["variant"] else ""
    write_text(out.table_md, f"# {track}: robustness{at}\n\n" + "\n".join(md))
    write_text(out.subspace_md, f"# {track}: where the relearning update goes\n\n" + "\n".join(smd))
    title = f"{track}{at}: recovery against attack steps"
    recovery_figure([(exp, f) for exp, f, _ in parts], plan["models"], labels, title, out.figure)
    title = f"{track}{at}: share of the relearning update"
    subspace_figure([(exp, t) for exp, _, t in parts], labels, title, out.subspace_figure)
    log.info("robustness tables of %s: %d rows, %d subspace rows", track, len(frame), len(subspace))
