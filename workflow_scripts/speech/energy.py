"""Rule speech_energy: E_l of the sample and class settings side by side, with their localisation statistics
(each setting's energies and layer selection as rule energy wrote them, qrerase.method.energy.read_selection)."""

import pandas as pd

from qrerase.io import write_csv
from qrerase.method.energy import read_selection
from qrerase.reports.tables import Column, TableSpec, write_table
from qrerase.tracks.speech.tables import SETTING_LABELS, energy_compare_plot, localisation
from qrerase.workflow.job import job

p, out = snakemake.params, snakemake.output
with job(snakemake) as log:
    energies, rows = {}, []
    for setting, csv in zip(p.settings, snakemake.input.energy):
        selection = read_selection(csv)
        energy = selection.energy
        energies[SETTING_LABELS[setting]] = energy
        stats = localisation(energy, selection.layers)
        rows.append({"setting": setting, **stats, **{f"E_{k}": v for k, v in energy.items()}})
        log.info("%s: %s", setting, stats)
    table = pd.DataFrame(rows)
    write_csv(out.csv, table)
    spec = TableSpec(
        columns=(
            Column("max_energy", "max E_l", None, "{:.3f}"),
            Column("n_selected", "layers with E_l >= 1/|L|", None, "{:.0f}"),
            Column("selected_share", "energy share of those layers", None, "{:.3f}"),
            Column("effective_layers", "effective layers exp(H)", None, "{:.2f}"),
        ),
        label_column="setting",
        label_header="Setting",
        labels=SETTING_LABELS,
    )
    write_table(table, spec, None, out.md, None)
    energy_compare_plot(energies, out.figure, title="Speech: layer-wise normalised task energy of the forget adapters")
