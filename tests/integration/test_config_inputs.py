"""Config files and --config values as Snakemake hands them over: a repeated key is refused with
file:line, nested --config values are typed as in a config file (issue 62), through real dry runs."""

from __future__ import annotations

import pytest
import yaml
from support.snakemake_cli import assert_config_error, planned_rules, snakemake, write_config


def test_load_yaml_refuses_a_repeated_key_naming_file_and_line(tmp_path):
    from qrerase.io import load_yaml

    path = tmp_path / "overlay.yaml"
    path.write_text("unlearn:\n  scale: 2.0\n  rank: 4\nlora:\n  r: 8\nunlearn:\n  rank: 2\n")
    with pytest.raises(ValueError, match=r"overlay\.yaml:6: duplicate key 'unlearn' \(first at line 1\)$"):
        load_yaml(path)
    path.write_text("lora:\n  r: 8\n  alpha: 16\n  r: 4\n")  # nested
    with pytest.raises(ValueError, match=r"overlay\.yaml:4: duplicate key 'r' \(first at line 2\)"):
        load_yaml(path)
    path.write_text("a: [1, {b: 2}]\nc: {d: 1.5e-3, e: null}\n")
    assert load_yaml(path) == yaml.safe_load(path.read_text())  # otherwise what safe_load reads
    path.write_text("a: [1\n")
    with pytest.raises(ValueError, match=r"overlay\.yaml: not valid YAML"):
        load_yaml(path)


def test_a_repeated_key_in_an_overlay_fails_the_dry_run_in_one_line(tmp_path):
    cfg = write_config(tmp_path)
    cfg.write_text(cfg.read_text() + "\nunlearn:\n  rank: 3\n")  # test.yaml has an unlearn section already
    text = cfg.read_text().splitlines()
    first = next(i for i, line in enumerate(text) if line.startswith("unlearn:")) + 1
    assert_config_error(tmp_path, cfg, f"{cfg}:{len(text) - 1}: duplicate key 'unlearn' (first at line {first})")


def test_a_nested_config_value_is_typed_as_in_a_config_file(tmp_path):
    """`--config unlearn={rank: 3}` was refused as "'3' is not of type 'integer'"."""
    cfg = write_config(tmp_path)
    plain = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg))
    typed = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--config", "unlearn={rank: 3}")
    assert "k3" in typed.stdout and "k3" not in plain.stdout  # the rank reached the plan
    assert planned_rules(typed) == planned_rules(plain)
    bad = snakemake(
        tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--config", "unlearn={scale: abc}", check=False
    )
    assert bad.returncode != 0 and "config key 'unlearn.scale'" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
    assert not (tmp_path / "results").exists()
