"""Placement, saving and mixed precision of the engine's sharded (FSDP2) runs, measured on real gloo
workers on the CPU (tests/support/dist_worker.py under torchrun), against one process.

* Only rank 0 reads the weight files of a sharded load: the workers run under ``strace -f -Y`` (each
  worker names itself ``rank<R>``, so every thread it starts carries that name) and every successful
  ``openat`` of the checkpoint's ``model.safetensors`` is attributed to a rank. The trained weights
  still equal one process's (relative update difference < 1e-2). NPO (full and LoRA mode) computes
  π_ref's NLLs after the sharded preparation, so its reference is loaded sharded too.
* The end-of-training save (optimiser freed, full state gathered tensor by tensor to rank 0's CPU,
  rank 0's write) keeps each rank's peak resident memory (VmHWM, reset between the phases) within
  its training peak plus one tensor, on a deep narrow Llama (16 layers, 43 MB) whose largest tensor
  is 1/82 of it. (Gathering every tensor on every rank and cloning it before the optimiser is freed,
  as the engine did, exceeds the training peak by about one model: +44 MB per rank.)
* A bf16 model under FSDP2 gets the explicit mixed-precision policy: bf16 parameters for the forward
  and backward passes, float32 gradient reduction, float32 master shards.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support import PYTHONPATH
from support import REPO as ROOT
from support.rank_opens import strace_missing
from support.tiny_text import TINY, TPL, tofu_qa

from qrerase.models.checkpoints import save_model
from qrerase.text.models import build_tiny_llama, load_model, load_tokenizer

WORKER = ROOT / "tests" / "support" / "dist_worker.py"

pytestmark = pytest.mark.slow  # scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def model_dir(tok_dir, tmp_path_factory):
    """The tiny model of tests/support/dist_worker.py (seed 9) as a checkpoint on disk."""
    tok = load_tokenizer(tok_dir)
    out = tmp_path_factory.mktemp("model") / "model"
    save_model(build_tiny_llama(TINY, tok, seed=9), tok, out)
    return out


def _strace() -> list[str] | None:
    """The strace prefix that logs successful opens per named process, or None where strace cannot run."""
    exe = shutil.which("strace")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True)
    return (
        [exe, "-f", "-Y", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-e", "status=successful"]
        if (probe.returncode == 0)
        else None
    )


def _run(kind, backend, tok_dir, out, processes, model_dir=None, trace=None, **env_extra):
    env = {**os.environ, "PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1", **env_extra}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["ACCELERATE_USE_CPU"] = "true"  # gloo on the CPU even where a GPU is visible (the launcher's flag)
    args = [str(WORKER), kind, backend, str(tok_dir), str(out), *([str(model_dir)] if model_dir else [])]
    if processes == 1:
        cmd = [sys.executable, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *args]
    if trace is not None:
        cmd = [*trace, "-P", str(model_dir / "model.safetensors"), "-o", str(out) + ".strace", *cmd]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _openers(log: Path, weights: Path) -> dict[str, int]:
    """Process name → number of successful opens of ``weights`` in an strace ``-f -Y`` log."""
    counts: dict[str, int] = {}
    for line in log.read_text().splitlines():
        m = re.match(r"\d+<([^>]*)>\s+openat\(.*?\"([^\"]+)\"", line)
        if m and Path(m.group(2)).resolve() == weights.resolve():
            counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def _relative_update_difference(a, b, start):
    num = sum(float((a[k].float() - b[k].float()).norm() ** 2) for k in a) ** 0.5
    den = sum(float((a[k].float() - start[k].float()).norm() ** 2) for k in a) ** 0.5
    assert den > 0
    return num / den


# npo: the model and its reference, both sharded, the reference's NLLs computed after preparation
# and then dropped (the worker checks its shards are freed); npo-lora: LoRA under FSDP2 (add_lora,
# train_steps, merge on rank 0, as train_lora) with π_ref the prepared model's adapter-disabled self.
# The fine-tune, LoRA, NPO and KL workflow jobs are traced the same way through the snakemake CLI
# (tests/workflow/test_launch_workflow.py, which also found every rank hashing the weights for the
# resume key); a kept reference (kl) loads as npo's does (its FSDP2 training:
# tests/integration/test_engine_multiprocess.py).
@pytest.mark.parametrize("kind", ["npo", "npo-lora"])
def test_sharded_load_reads_the_weights_on_rank_0_only(kind, tok_dir, model_dir, tmp_path):
    trace = _strace()
    if trace is None:
        pytest.skip(strace_missing())
    _run(kind, "fsdp", tok_dir, tmp_path / "one.safetensors", 1, model_dir)
    _run(kind, "fsdp", tok_dir, tmp_path / "two.safetensors", 2, model_dir, trace=trace)
    opened = _openers(tmp_path / "two.safetensors.strace", model_dir / "model.safetensors")
    print(f"{kind}: opens of model.safetensors by process name: {opened}")
    assert set(opened) == {"rank0"}, opened  # npo: the model and its (sharded) reference, both by rank 0
    one, two = load_file(str(tmp_path / "one.safetensors")), load_file(str(tmp_path / "two.safetensors"))
    assert sorted(one) == sorted(two)
    start = build_tiny_llama(TINY, load_tokenizer(tok_dir), seed=9).state_dict()
    diff = _relative_update_difference(one, two, start)
    print(f"{kind}: relative update difference 2 vs 1 process {diff:.2e}")
    assert diff < 1e-2, diff


def test_saving_stays_within_the_training_peak_plus_one_tensor(tok_dir, tmp_path):
    out = tmp_path / "mem"
    # glibc serves blocks >= 64 KiB (every weight-sized tensor here) with their own mappings and unmaps
    # them when freed, so the resident set follows the live tensors instead of the allocator's cache
    _run("memory", "fsdp", tok_dir, out, 2, MALLOC_MMAP_THRESHOLD_="65536")
    for rank in (0, 1):
        m = json.loads(Path(f"{out}.rank{rank}.json").read_text())
        assert m["model_bytes"] >= 20 * m["largest_tensor"]  # a model of many tensors, none large
        print(f"rank {rank}: {m}")
        assert m["save"] * 1024 <= m["train"] * 1024 + m["largest_tensor"], (rank, m)
    saved = load_file(str(out) + ".model/model.safetensors")
    assert sum(t.numel() * t.element_size() for t in saved.values()) == m["model_bytes"]


def test_bf16_fsdp2_policy_gathers_bf16_and_reduces_float32(tok_dir, tmp_path):
    out = tmp_path / "bf16"
    _run("bf16", "fsdp", tok_dir, out, 2)
    for rank in (0, 1):
        seen = json.loads(Path(f"{out}.rank{rank}.json").read_text())
        print(f"rank {rank}: {seen}")
        assert len(seen["groups"]) >= TINY.num_hidden_layers  # each decoder layer (the root is the engine's)
        for group in seen["groups"]:
            assert group["param_dtype"] == "torch.bfloat16" and group["reduce_dtype"] == "torch.float32", group
            assert group["sharded_dtype"] == "torch.float32", group  # float32 master shards
        assert seen["forward_weight_dtype"] == "torch.bfloat16"  # what the layer computes with
    assert seen["saved_dtype"] == "torch.bfloat16"  # rank 1's empty copy keeps the configured dtype


def test_nonzero_rank_builds_the_checkpoint_without_its_weights(tok_dir, model_dir, monkeypatch):
    """A sharded load on rank 1: the architecture, buffers and generation config of the checkpoint,
    parameters of the right shapes and dtypes with their own (uninitialised) storage."""
    whole = load_model(model_dir)
    monkeypatch.setenv("RANK", "1")
    empty = load_model(model_dir, sharded=True)
    assert type(empty) is type(whole) and not empty.training
    params = dict(empty.named_parameters())
    assert {n: (p.shape, p.dtype) for n, p in params.items()} == {
        n: (p.shape, p.dtype) for n, p in whole.named_parameters()
    }
    assert all(p.device.type == "cpu" for p in params.values())
    assert len({p.data_ptr() for p in params.values()}) == len(params)  # distinct storage: optimiser mapping
    for (name, a), (_, b) in zip(whole.named_buffers(), empty.named_buffers()):
        assert torch.equal(a, b), name  # rotary frequencies computed from config.json
    assert empty.generation_config.pad_token_id == whole.generation_config.pad_token_id


def test_lora_reference_is_the_base_with_the_adapter_disabled(tok_dir, model_dir):
    """In LoRA mode π_ref is the trained model with its adapter disabled: after the adapter has moved,
    its NLLs equal a separate copy of the base's, and the model's own NLLs differ."""
    from qrerase.baselines.text import AdapterDisabled, _reference_nll
    from qrerase.text.lm import encode_qa_many, pad_token_id, qa_pair
    from qrerase.text.training import LoraTrainConfig, add_lora

    tok = load_tokenizer(tok_dir)
    base = load_model(model_dir)
    copy_of_base = copy.deepcopy(base)
    peft = add_lora(base, LoraTrainConfig(r=4))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    examples = encode_qa_many(tok, TPL, [qa_pair(r) for r in tofu_qa(360, 372)], 64)
    pad = pad_token_id(tok)
    ref = _reference_nll(AdapterDisabled(peft), examples, pad, 4)
    assert torch.equal(ref, _reference_nll(copy_of_base, examples, pad, 4))
    assert not torch.allclose(ref, _reference_nll(peft, examples, pad, 4))


def test_every_text_baseline_loads_its_models_sharded_under_fsdp2(monkeypatch):
    """Under FSDP2 over several processes every text baseline (a kept reference: kl; NLLs computed
    once: npo, dpo; none: ga), full or LoRA mode, loads its model and reference on rank 0 alone."""
    from qrerase.baselines.text import TextBaselineConfig, loads_sharded

    for method in ("ga", "kl", "npo", "dpo"):
        for mode in ("full", "lora"):
            monkeypatch.setenv("WORLD_SIZE", "2")
            assert loads_sharded(TextBaselineConfig.of(method=method, mode=mode, backend="fsdp")) == (True, True)
            assert loads_sharded(TextBaselineConfig.of(method=method, mode=mode, backend="ddp")) == (False, False)
            monkeypatch.setenv("WORLD_SIZE", "1")
            assert loads_sharded(TextBaselineConfig.of(method=method, mode=mode, backend="fsdp")) == (False, False)
