"""Rule energy: E_l = ||T_f^l||_F / sum_j ||T_f^j||_F (eq. 14) and the layers with E_l >= 1/|L| (eq. 15)."""

from qrerase.method.adapters import load_factors
from qrerase.method.energy import layer_energy, modules_for_layers, select_layers, write_selection
from qrerase.reports.plots import energy_plot
from qrerase.workflow.job import job

with job(snakemake) as log:
    granularity = snakemake.params.granularity
    factors = load_factors(snakemake.input[0])
    energy = layer_energy(factors, granularity=granularity)
    selected = select_layers(energy)
    modules = modules_for_layers(selected, factors, granularity=granularity)
    write_selection(energy, selected, modules, granularity, snakemake.output.csv, snakemake.output.selected)
    energy_plot(energy, snakemake.output.figure, title=f"Task energy ({snakemake.wildcards.exp})", selected=selected)
    log.info("selected %d of %d layers: %s", len(selected), len(energy), selected)
