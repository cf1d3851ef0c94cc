"""Rule cost: a track's wall time per method (baseline training vs LoRA + closed-form erase) from benchmark files."""

from qrerase.bench.cost import grouped_method_costs, method_costs
from qrerase.reports.cost import cost_table
from qrerase.reports.tables import write_table
from qrerase.workflow.job import job

with job(snakemake) as log:
    groups, column = snakemake.params.groups, snakemake.params.group_column
    if column is None:
        costs = method_costs(groups[""])
    else:
        costs = grouped_method_costs(groups, column)
    df, spec = cost_table(costs, column, snakemake.params.group_header)
    write_table(df, spec, snakemake.output.csv, snakemake.output.md, None)
    log.info("wall time per method (s):\n%s", costs.round(2).to_string(index=False))
