"""Two gloo worker processes (torchrun, the engine's launcher) against one process, on a tiny real model.

The same script (tests/support/dist_worker.py) trains with the same global batch (8) and micro-batch (2):
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

import numpy as np
import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from support import PYTHONPATH
from support import REPO as ROOT
from support.tiny_text import TINY

from qrerase.text.models import build_tiny_llama

WORKER = ROOT / "tests" / "support" / "dist_worker.py"

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)
#: The files of one torch.distributed.checkpoint folder written by 2 ranks: one shard per rank, the index.
SHARD_FILES = ("__0_0.distcp", "__1_0.distcp", ".metadata")


def _launch(kind, backend, tok_dir, out, processes, extra_env=None):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "QRERASE_TEST_RESUME_DIR"):
        env.pop(key, None)
    env.update(extra_env or {})
    args = [str(WORKER), kind, backend, str(tok_dir), str(out)]
    if processes == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _run(kind, backend, tok_dir, out, processes, extra_env=None):
    proc = _launch(kind, backend, tok_dir, out, processes, extra_env)
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


@pytest.fixture(scope="module")
def two_processes(tok_dir, tmp_path_factory):
    """The 2-process run of a (kind, backend), each run once: (weights, path of its output)."""
    done = {}

    def get(kind, backend):
        if (kind, backend) not in done:
            out = tmp_path_factory.mktemp(f"{kind}-{backend}") / "two.safetensors"
            done[kind, backend] = _run(kind, backend, tok_dir, out, 2), out
        return done[kind, backend]

    return get


def _start(tok_dir):
    from qrerase.text.models import load_tokenizer

    return build_tiny_llama(TINY, load_tokenizer(tok_dir), seed=9).state_dict()


@pytest.mark.parametrize(
    # DDP here; FSDP2 fine-tune, LoRA, NPO and KL (a reference kept through training) equal 1 process through
    # the CLI (tests/workflow/test_launch_workflow.py), NPO's reference NLLs after the sharded preparation
    # (full and LoRA mode) in tests/integration/test_engine_placement.py, FSDP2 resume below. The task-level
    # KGA (auxiliary models sharded for their own training, then again as KGA's frozen references) and KU
    # (a stopping check that evaluates the model between steps) under FSDP2: both failed before.
    "kind,backend",
    [("finetune", "ddp"), ("lora", "ddp"), ("kga", "fsdp"), ("ku", "fsdp")],
)
def test_two_processes_equal_one(kind, backend, tok_dir, one_process, two_processes):
    one = one_process(kind)
    two, _ = two_processes(kind, backend)
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
    base = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
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


def test_fsdp_resume_equals_uninterrupted(tok_dir, tmp_path, two_processes):
    """A 2-process FSDP2 NPO run (full mode: every weight trained, π_ref's NLLs computed after the
    sharded preparation) keeping a resume state after every step (``checkpoint_every: 1``) crashes
    right after step 3's state (every rank exits); its states are sharded (one DCP file per rank for
    the model and for the optimiser, no full model file) and hold the trained model only (π_ref is
    dropped before any state is saved), and a corrupted shard of the newest fails its checksum. The
    restarted job (which computes π_ref's NLLs again) falls back to step 2, continues and ends with
    the same weights and loss curve as an uninterrupted 2-process run; its process group had the
    configured timeout (``dist_timeout_min: 7``)."""
    import torch.distributed.checkpoint as dcp

    from qrerase.engine.resume import check_state

    resume = tmp_path / "resume"
    env = {"QRERASE_TEST_RESUME_DIR": str(resume)}
    out = tmp_path / "resumed.safetensors"
    crashed = _launch("npo", "fsdp", tok_dir, out, 2, {**env, "QRERASE_TEST_EXIT_AFTER": "3"})
    assert crashed.returncode != 0 and not out.exists(), crashed.stderr[-3000:]
    run = resume / "npo"
    assert sorted(p.name for p in run.glob("step-*")) == ["step-2", "step-3"]  # the newest two kept
    for state in run.glob("step-*"):
        files = {p.relative_to(state).as_posix() for p in state.rglob("*") if p.is_file()}
        assert {f"trained_0/{name}" for name in SHARD_FILES} <= files, files  # model and optimiser shards
        assert not [f for f in files if f.endswith((".bin", ".safetensors"))], files  # no full model or optimiser
        assert check_state(state) is None
        saved = dcp.FileSystemReader(str(state / "trained_0")).read_metadata().state_dict_metadata
        model = sorted(k for k in saved if k.startswith("model."))
        assert model == sorted(f"model.model.{k}" for k in _start(tok_dir)), model  # no π_ref
        assert any(k.startswith("optim.state.") for k in saved), sorted(saved)
    shard = run / "step-3" / "trained_0" / "__1_0.distcp"  # rank 1's shards
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = _launch("npo", "fsdp", tok_dir, out, 2, env)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "step-3 is corrupt: trained_0/__1_0.distcp fails its checksum" in resumed.stderr
    assert f"resumed training from {run / 'step-2'}" in resumed.stderr
    assert not resume.exists()  # removed once the job's outputs are written
    assert float(Path(f"{out}.timeout").read_text()) == 7.0
    uninterrupted, path = two_processes("npo", "fsdp")
    weights = load_file(str(out))
    assert sorted(weights) == sorted(uninterrupted)
    for key, value in uninterrupted.items():  # the same computation: equal to float rounding
        torch.testing.assert_close(weights[key], value, rtol=1e-6, atol=1e-7)
    curve, reference = pd.read_csv(f"{out}.csv"), pd.read_csv(f"{path}.csv")
    assert len(curve) == len(reference) == 6
    np.testing.assert_allclose(curve[["loss", "lr"]].to_numpy(), reference[["loss", "lr"]].to_numpy(), rtol=1e-6)
