"""Two gloo worker processes (torchrun, the engine's launcher) against one process, on a tiny real model.

The same script (tests/dist_worker.py) trains with the same global batch (8) and micro-batch (2):
one process accumulates 4 micro-batches, two processes 2 each and average their gradients through
the engine (Accelerate DDP, or FSDP2 with sharded parameters and optimiser states). The trained
weights must agree within float rounding (relative difference of the update < 1e-2), and every
rank must end with plain full tensors (the worker asserts it before rank 0 saves).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file
from tiny_text import TINY

from qrerase.text.models import build_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "dist_worker.py"

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


def _run(kind, backend, tok_dir, out, processes):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    args = [str(WORKER), kind, backend, str(tok_dir), str(out)]
    if processes == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return load_file(str(out))


def _relative_update_difference(a, b, start):
    num = sum(float((a[k].float() - b[k].float()).norm() ** 2) for k in a) ** 0.5
    den = sum(float((a[k].float() - start[k].float()).norm() ** 2) for k in a) ** 0.5
    assert den > 0
    return num / den


@pytest.fixture(scope="module")
def one_process(tok_dir, tmp_path_factory):
    """The one-process run of a kind (the backend plays no part with one process), each run once."""
    done = {}

    def get(kind):
        if kind not in done:
            done[kind] = _run(kind, "ddp", tok_dir, tmp_path_factory.mktemp(kind) / "one.safetensors", 1)
        return done[kind]

    return get


def _start(tok_dir):
    from qrerase.text.models import load_tokenizer

    return build_tiny_llama(TINY, load_tokenizer(tok_dir), seed=9).state_dict()


@pytest.mark.parametrize(
    "kind,backend", [("finetune", "ddp"), ("finetune", "fsdp"), ("lora", "ddp"), ("npo", "ddp"), ("kl", "fsdp")]
)
def test_two_processes_equal_one(kind, backend, tok_dir, tmp_path, one_process):
    one = one_process(kind)
    two = _run(kind, backend, tok_dir, tmp_path / "two.safetensors", 2)
    assert sorted(one) == sorted(two)
    diff = _relative_update_difference(one, two, _start(tok_dir))
    assert diff < 1e-2, diff


def test_two_machines_equal_one_process(tok_dir, tmp_path, one_process):
    """Two launchers on localhost standing in for two nodes (machine ranks 0 and 1, one process each),
    as `srun` starts qrerase.workflow.multinode on each node of a multi-node job."""
    import shutil
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "machines.safetensors"
    accelerate = shutil.which("accelerate") or str(Path(sys.executable).with_name("accelerate"))
    base = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_NNODES"):
        base.pop(key, None)
    base.update(QRERASE_MAIN_ADDR="127.0.0.1", QRERASE_MAIN_PORT=str(port))
    cmd = [sys.executable, "-m", "qrerase.workflow.multinode", "--nodes", "2", "--processes-per-node", "1"]
    cmd += ["--accelerate", accelerate, "--config_file", str(ROOT / "envs/accelerate/multi_process.yaml"), "--"]
    cmd += [str(WORKER), "finetune", "fsdp", str(tok_dir), str(out)]
    nodes = [
        subprocess.Popen(cmd, env={**base, "SLURM_NODEID": str(r)}, stderr=subprocess.PIPE, text=True) for r in (0, 1)
    ]
    errors = [p.communicate(timeout=600)[1] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], errors[0][-3000:] + errors[1][-3000:]
    two = load_file(str(out))
    one = one_process("finetune")
    assert sorted(one) == sorted(two)
    diff = _relative_update_difference(one, two, _start(tok_dir))
    assert diff < 1e-2, diff
