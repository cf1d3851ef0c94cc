"""Byte-identical artifacts across processes: safetensors metadata and PEFT adapter configs.

Python's hash randomisation (and safetensors' Rust hash map) order sets and maps differently in every
process; these writers must not let that reach the bytes of an artifact.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from support import REPO, TESTS


def _run(code: str, *args: str, hashseed: int) -> None:
    env = {**os.environ, "PYTHONHASHSEED": str(hashseed), "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_save_arrays_is_byte_identical_across_processes(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "from qrerase.io import save_arrays\n"
        "meta = {f'key{i}': 'v' * i for i in range(12)}\n"
        "save_arrays(sys.argv[1], {'b': np.arange(6.0).reshape(2, 3), 'a': np.ones(3, np.float32)}, metadata=meta)\n"
    )
    for seed in range(4):
        _run(code, str(tmp_path / f"{seed}.safetensors"), hashseed=seed)
    assert len({_sha(tmp_path / f"{seed}.safetensors") for seed in range(4)}) == 1
    from safetensors import safe_open

    with safe_open(str(tmp_path / "0.safetensors"), "np") as f:
        assert list(f.metadata()) and f.metadata()["key3"] == "vvv"
        assert f.get_tensor("b").tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_save_adapter_config_is_byte_identical_across_processes(tmp_path):
    code = (
        "import sys, torch\n"
        "sys.path.insert(0, sys.argv[2])\n"
        "from support.tiny_llama import build_tiny_llama\n"
        "from peft import LoraConfig, get_peft_model\n"
        "from qrerase.text.training import save_adapter\n"
        "model = get_peft_model(build_tiny_llama(0), LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,\n"
        "    target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj']))\n"
        "save_adapter(model, sys.argv[1])\n"
    )
    for seed in (1, 2):
        _run(code, str(tmp_path / f"a{seed}"), str(TESTS), hashseed=seed)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert _sha(tmp_path / "a1" / name) == _sha(tmp_path / "a2" / name), name
    import json

    modules = json.loads((tmp_path / "a1" / "adapter_config.json").read_text())["target_modules"]
    assert modules == sorted(modules) and len(modules) == 7
