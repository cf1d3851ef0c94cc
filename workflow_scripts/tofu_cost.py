"""Rule tofu_cost: per-method wall time (baseline training vs LoRA + closed-form erase) from benchmark files."""

from qrerase.bench import method_costs
from qrerase.tables import cost_table, write_table
from qrerase.workflow import job

with job(snakemake) as log:  # noqa: F821
    costs = method_costs(snakemake.params.components)  # noqa: F821
    df, spec = cost_table(costs)
    write_table(df, spec, snakemake.output.csv, snakemake.output.md, None)  # noqa: F821
    log.info("wall time per method (s):\n%s", costs.round(2).to_string(index=False))
