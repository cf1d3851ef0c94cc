"""Rule tofu_table: the paper's TOFU table (and a wide variant) plus the truth-ratio figure."""

import dataclasses

import pandas as pd

from qrerase.plots import truth_ratio_plot
from qrerase.tables import METHOD_LABELS, tofu_table, write_table
from qrerase.tofu import load_log, metrics_frame, truth_ratios
from qrerase.workflow import job

p = snakemake.params  # noqa: F821
out = snakemake.output  # noqa: F821
with job(snakemake) as log:  # noqa: F821
    logs = {m.rsplit("_k", 1)[0]: load_log(d) for m, d in zip(p.models, snakemake.input.logs)}  # noqa: F821
    reference = logs[p.reference]
    labels = dict(METHOD_LABELS)
    frames = []
    for method, model_log in logs.items():
        frame = metrics_frame(model_log, None if method == p.reference else reference, model=method)
        frames.append(frame)
    imported = []
    for item in p.imported:
        name = item["name"]
        model_log = load_log(item["log"])
        ref = load_log(item["reference"]) if item.get("reference") else reference
        frames.append(metrics_frame(model_log, ref, model=name))
        labels[name] = item.get("label", name)
        imported.append(name)
    rows = pd.concat(frames, ignore_index=True)
    caption = (
        f"TOFU {snakemake.config['tofu']['data']['split']}: Model Utility and Forget Quality "  # noqa: F821
        f"(KS p-value against the retain-only reference; checkmark: p > 0.1). Subspace methods at rank k={p.rank}. "
        "Bold/underlined: best/second-best."
    )
    for wide, key in ((False, "tofu"), (True, "tofu_wide")):
        df, spec = tofu_table(rows, wide=wide)
        spec = dataclasses.replace(
            spec,
            labels=labels,
            tex_labels={**spec.tex_labels, **{n: labels[n] for n in imported}},
            reference_rows=(*spec.reference_rows, *imported),
        )
        write_table(
            df, spec, out[f"{key}_csv"], out[f"{key}_md"], out[f"{key}_tex"],
            caption=caption, label=f"tab:{key}", environment="table*" if wide else "table",
        )
    ratios = {labels.get(m, m): truth_ratios(lg["eval_log_forget.json"]) for m, lg in logs.items()}
    pvalues = truth_ratio_plot(ratios, labels[p.reference], out.truth_ratio)
    log.info("forget-set truth-ratio KS p-values: %s", pvalues)
