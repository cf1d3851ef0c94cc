"""Reproducibility: seeding every RNG, deterministic kernels, and the per-epoch seeds of batch order.

Shared by the text (:mod:`qrerase.text.training`) and speech (:mod:`qrerase.tracks.speech.train`) trainers and
by :func:`qrerase.workflow.job.job`. Two runs with the same seed, data and thread count give
bit-identical weights.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

__all__ = ["set_determinism", "epoch_seed"]


def set_determinism(seed: int, threads: int) -> None:
    """Seed Python, NumPy and torch, fix the intra-op thread count, require deterministic kernels."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # only matters on CUDA
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if threads and threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True)


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch`` of a run seeded by ``seed``: ``(seed·1000003 + epoch) mod 2⁶³``."""
    return (int(seed) * 1_000_003 + int(epoch)) % (2**63)
