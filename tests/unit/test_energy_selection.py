"""The one reader of the layer selection (eqs. 14-16), qrerase.method.energy.read_selection: rule energy's
two files written as the rule writes them, read back; its consumers (eq. 16's updates, the energy
figure's colours, the speech localisation statistics) take the selection read, never a recomputation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qrerase.method.energy import (
    LayerSelection,
    layer_energy,
    modules_for_layers,
    read_selection,
    select_layers,
    selected_updates,
    threshold,
    write_selection,
)
from qrerase.method.lowrank import LowRank
from qrerase.reports.plots import energy_plot
from qrerase.tracks.speech.tables import localisation


def _factors(norms: list[float]) -> dict[str, LowRank]:
    """One q_proj per block whose ‖B A‖_F is the given norm (B: a scaled unit column, A: a unit row)."""
    out = {}
    for i, n in enumerate(norms):
        b, a = np.zeros((3, 1)), np.zeros((1, 4))
        b[i % 3, 0], a[0, i % 4] = n, 1.0
        out[f"model.layers.{i}.self_attn.q_proj"] = LowRank(b, a)
    return out


def _write_like_rule_energy(folder, factors):
    """workflow_scripts/core/energy.py's two outputs."""
    energy = layer_energy(factors)
    selected = select_layers(energy)
    modules = modules_for_layers(selected, factors)
    write_selection(energy, selected, modules, "block", folder / "energy.csv", folder / "selected_layers.json")


def test_read_selection_reads_both_files_of_rule_energy(tmp_path):
    # norms 3, 1, 1, 1: E = (1/2, 1/6, 1/6, 1/6) (eq. 14), 1/|L| = 1/4, so L_forget = {0} (eq. 15)
    factors = _factors([3.0, 1.0, 1.0, 1.0])
    _write_like_rule_energy(tmp_path, factors)
    from_csv = read_selection(tmp_path / "energy.csv")
    assert from_csv.layers == ("0",) and from_csv.modules is None and from_csv.granularity is None
    assert list(from_csv.energy) == ["0", "1", "2", "3"]
    assert from_csv.energy == pytest.approx({"0": 0.5, "1": 1 / 6, "2": 1 / 6, "3": 1 / 6}, abs=1e-10)
    from_json = read_selection(tmp_path / "selected_layers.json")
    assert from_json == LayerSelection(("0",), None, ("model.layers.0.self_attn.q_proj",), "block")
    assert threshold(4) == 0.25
    updates = {m: f"update {m}" for m in factors}
    assert selected_updates(updates, tmp_path / "selected_layers.json") == {
        "model.layers.0.self_attn.q_proj": "update model.layers.0.self_attn.q_proj"
    }


def test_a_read_never_recomputes(tmp_path):
    """Uniform energies written with 10 significant digits (0.3333333333 each, just below 1/3): eq. 15
    recomputed from the CSV depends on the tolerance (exactly, rtol=0, it drops every layer); the reader
    keeps the rule's selection (all three)."""
    _write_like_rule_energy(tmp_path, _factors([1.0, 1.0, 1.0]))
    sel = read_selection(tmp_path / "energy.csv")
    assert set(sel.energy.values()) == {0.3333333333}
    assert sel.layers == ("0", "1", "2")
    assert select_layers(sel.energy, rtol=0.0) == []  # what a recomputation without tolerance would say
    stats = localisation(sel.energy, sel.layers)
    assert stats["n_selected"] == 3 and stats["selected_share"] == pytest.approx(3 * 0.3333333333)
    assert stats["effective_layers"] == pytest.approx(3.0, rel=1e-9)


def test_bad_selection_files_name_the_file(tmp_path):
    cases = {
        "a.csv": ("layer,energy\n0,1.0\n", "expected rule energy's columns layer, energy, selected"),
        "b.csv": ("layer,energy,selected\n0,1.0,yes\n", "layer '0': selected must be True or False, got 'yes'"),
        "c.json": ('{"layers": ["0"]}', 'expected a "modules" list'),
        "d.json": ('{"modules": [], "layers": [], "granularity": "row"}', "granularity must be one of"),
        "e.txt": ("", "expected rule energy's energy.csv or selected_layers.json"),
        "f.json": ("[1, 2]", "not a JSON object"),
    }
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError) as exc:
            read_selection(tmp_path / name)
        assert str(exc.value).startswith(f"{tmp_path / name}: ") and message in str(exc.value)
        assert "\n" not in str(exc.value)
    with pytest.raises(ValueError, match="missing.csv: "):
        read_selection(tmp_path / "missing.csv")
    _write_like_rule_energy(tmp_path, _factors([3.0, 1.0]))
    with pytest.raises(ValueError, match="expected rule energy's selected_layers.json"):
        selected_updates({"x": 1}, tmp_path / "energy.csv")
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="positive int"):
            threshold(bad)
    with pytest.raises(ValueError, match=r"selected layer\(s\) \['7'\] have no energy"):
        energy_plot({"0": 0.6, "1": 0.4}, tmp_path / "e.png", selected=["7"])
    with pytest.raises(ValueError, match=r"selected layer\(s\) \['7'\] have no energy"):
        localisation({"0": 0.6, "1": 0.4}, ["7"])
    assert not math.isnan(localisation({"0": 0.6, "1": 0.4}, ["0"])["selected_share"])


def test_the_factor_report_shows_the_selection_read(tmp_path):
    from qrerase.method.diagnostics import factor_report

    factors = _factors([3.0, 1.0, 1.0, 1.0])
    _write_like_rule_energy(tmp_path, factors)
    computed = factor_report(factors, factors, 1)
    read = factor_report(factors, factors, 1, forget_selection=read_selection(tmp_path / "selected_layers.json"))
    assert read.equals(computed)  # the rule's selection is eq. 15's: the same report
    assert list(read.loc[read["set"] == "forget", "selected"]) == [True, False, False, False]
    # a selection other than eq. 15's is shown as read (the retain rows keep their own eq. 15)
    other = factor_report(factors, factors, 1, forget_selection=LayerSelection(("2",)))
    assert list(other.loc[other["set"] == "forget", "selected"]) == [False, False, True, False]
    assert list(other.loc[other["set"] == "retain", "selected"]) == [True, False, False, False]
    with pytest.raises(ValueError, match=r"selected layer\(s\) \['9'\] are no block of the forget adapter"):
        factor_report(factors, factors, 1, forget_selection=LayerSelection(("9",)))
