"""Shared fixtures (random PEFT LoRA adapters of the tiny Llama, a small BPE tokenizer) and the suite's
scheduling hooks. Helper functions live in tests/support/, the one place test modules import from."""

from __future__ import annotations

import os
from pathlib import Path

# The Hugging Face cache of the whole suite, set before anything imports huggingface_hub (which reads it
# once): the presets' hub models as a user has them after "Fetch the model once" (docs/cluster.md), their
# config.json alone, so that planning a preset finds its model cached (qrerase.workflow.validation's
# check_hub_cache) and no test reads the cache of the machine it runs on. tests/unit/test_config.py
# checks that it holds every preset's model.
os.environ["HF_HUB_CACHE"] = str(Path(__file__).resolve().parent / "support" / "hub_cache")

import pytest
from support import REPO
from support.tiny_llama import save_random_lora

if os.environ.get("PYTEST_XDIST_WORKER"):
    # The pytest-xdist workers share the cores: one OpenMP thread each (set before torch is imported),
    # as two 2-thread torch processes on 2 cores spin-wait on each other.
    os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto`` (pyproject.toml's addopts): one worker more than pytest-xdist's own count of the
    cores, capped by ``--maxprocesses``; ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides where it is set.
    A worker leaves its core idle while it waits (snakemake between jobs, file I/O, the Slurm
    test's status polling); the extra worker fills those gaps. On the 2-core developer machine (commit
    5d28bba, back to back), 2 workers left 13 % of the cores idle (555 of 4,134 core-seconds) and took
    34 min 27 s; 3 workers kept them 0-3 % idle (vmstat) and took 31 min 09 s. That machine's speed
    drifts: a fresh-clone `.ci/run` of 3 workers an hour later took 35 min 42 s for the same tests, its
    CPU time 4,017 s with the install against 3,376 s."""
    from xdist.plugin import pytest_xdist_auto_num_workers as cores

    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    return cores(config) + 1


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
    hands whole files to its workers in this order, and a slow file started last is the run's tail.
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


@pytest.fixture(scope="session")
def lora_pair(tmp_path_factory):
    """(forget_dir, retain_dir) of two random rank-4 LoRA adapters on every linear layer of the tiny Llama."""
    root = tmp_path_factory.mktemp("lora_pair")
    forget, _ = save_random_lora(root / "forget", seed=1)
    retain, _ = save_random_lora(root / "retain", seed=2)
    return forget, retain


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A BPE tokenizer (vocabulary 500) trained on 40 TOFU forget10 QA pairs, for the multi-process
    engine tests (tests/integration/test_engine_multiprocess.py, test_engine_placement.py)."""
    from qrerase.io import read_jsonl
    from qrerase.text.models import train_bpe_tokenizer

    rows = read_jsonl(REPO / "data" / "tofu" / "forget10.jsonl")[360:400]
    out = tmp_path_factory.mktemp("tok") / "tok"
    train_bpe_tokenizer([f"{r['prompt']} {r['response']}" for r in rows], 500, out)
    return out
