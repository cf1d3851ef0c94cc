"""Rule xling_table: cross-lingual metrics, the two paper tables and the utility/forget scatter."""

from pathlib import Path

from qrerase.io import write_csv
from qrerase.reports.tables import METHOD_LABELS, write_table
from qrerase.text.eval_log import load_log
from qrerase.tracks.crosslingual.data import language_label
from qrerase.tracks.crosslingual.plots import crosslingual_scatter
from qrerase.tracks.crosslingual.tables import BASE, REFERENCE, matrix_table, metrics_rows, pairs_table, scatter_points
from qrerase.workflow.job import job
from qrerase.workflow.naming import method_of

p, inp, out = snakemake.params, snakemake.input, snakemake.output
with job(snakemake) as log:
    logs, reference = {}, None
    for (exp, model), directory in zip(p.models, inp.logs):
        per_lang = {lang: load_log(Path(directory) / lang / "eval_log_aggregated.json") for lang in p.languages}
        if model == REFERENCE:
            reference = per_lang
        elif model == BASE:
            logs[(BASE, BASE)] = per_lang
        else:
            logs[(exp[len("xling_") :], method_of(model))] = per_lang
    metrics = metrics_rows(logs, reference)
    write_csv(out.metrics, metrics)

    pairs = [(x, y) for x in p.unlearn for y in p.languages]
    df, spec = pairs_table(metrics, p.methods, pairs)
    write_table(
        df,
        spec,
        out.crosslingual_csv,
        out.crosslingual_md,
        out.crosslingual_tex,
        caption=(
            "Cross-lingual unlearning on multilingual TOFU (forget01): unlearn in X, evaluate in Y (X$\\to$Y). "
            "Model Utility and Forget Quality (KS p-value against the retain-only reference evaluated in Y; "
            f"checkmark: $p>0.1$). Subspace methods at rank $k={p.rank}$. Bold/underlined: best/second-best."
        ),
        label="tab:crosslingual",
        environment="table*",
    )
    df, spec = matrix_table(metrics, p.table_method, p.unlearn, p.languages)
    write_table(
        df,
        spec,
        out.crosslingual_matrix_csv,
        out.crosslingual_matrix_md,
        out.crosslingual_matrix_tex,
        caption=(
            f"All unlearning / evaluation language pairs for {METHOD_LABELS.get(p.table_method, p.table_method)} "
            "(base-model rows: before unlearning). Romanised variants are marked (R)."
        ),
        label="tab:crosslingual_all_pairs",
    )
    points = scatter_points(metrics, p.table_method, p.unlearn, p.languages)
    crosslingual_scatter(
        points,
        out.scatter,
        labels={c: language_label(c) for c in p.languages},
        title=f"{METHOD_LABELS.get(p.table_method, p.table_method)}: cross-lingual forgetting",
    )
    log.info("pairs:\n%s", points.to_string(index=False))
