"""Whole-model erase benchmark (appendix): wall time and peak memory of the streaming QR-Erase pipeline.

Library side of ``workflow_scripts/studies/bench_erase.py``. :func:`bench_whole_model_erase` times the complete
streaming pipeline (energy → selection → decompose forget & retain → forget_update → erase-adapter
write) on random adapters with Llama-3-8B / 70B shapes, in a fresh child interpreter
(:func:`erase_child_main`) whose own peak RSS (``ru_maxrss`` of RUSAGE_SELF, read by the child itself
at the end) is reported — unlike RUSAGE_CHILDREN this cannot be inflated by other children of the
calling process, and unlike tracemalloc it counts BLAS/LAPACK allocations.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from ..io import write_csv
from .threads import blas_threads

__all__ = [
    "ModelShape",
    "MODEL_SHAPES",
    "ERASE_COLUMNS",
    "bench_whole_model_erase",
    "run_erase_benchmark",
    "erase_child_main",
]


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """Linear-layer shapes of a Llama-style decoder (q, k, v, o, gate, up, down per block)."""

    name: str
    n_blocks: int
    hidden: int
    intermediate: int
    kv_dim: int

    def modules(self) -> list[tuple[str, int, int]]:
        """(module name, d_out, d_in) for every adapted linear layer, in block / name order."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        per_block = [
            ("mlp.down_proj", h, i),
            ("mlp.gate_proj", i, h),
            ("mlp.up_proj", i, h),
            ("self_attn.k_proj", kv, h),
            ("self_attn.o_proj", h, h),
            ("self_attn.q_proj", h, h),
            ("self_attn.v_proj", kv, h),
        ]
        return [(f"model.layers.{b}.{m}", d_out, d_in) for b in range(self.n_blocks) for m, d_out, d_in in per_block]


MODEL_SHAPES: dict[str, ModelShape] = {
    "llama3-8b": ModelShape("llama3-8b", n_blocks=32, hidden=4096, intermediate=14336, kv_dim=1024),
    "llama3-70b": ModelShape("llama3-70b", n_blocks=80, hidden=8192, intermediate=28672, kv_dim=1024),
}

ERASE_COLUMNS = [
    "shape",
    "n_blocks",
    "n_modules",
    "n_layers_selected",
    "n_modules_written",
    "localized",
    "lora_rank",
    "rank",
    "decomp",
    "threads",
    "wall_s",
    "energy_s",
    "generate_s",
    "adapter_mb",
    "baseline_rss_mb",
    "peak_rss_mb",
]


def _factors(seed: int, which: int, index: int, d_out: int, d_in: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic random float32 LoRA factors for module ``index`` of set ``which`` (0 forget, 1 retain)."""
    rng = np.random.default_rng([seed, which, index])
    B = rng.standard_normal((d_out, r), dtype=np.float32)
    A = rng.standard_normal((r, d_in), dtype=np.float32)
    A *= np.float32(1.0 / math.sqrt(d_in))
    return B, A


def _vm_rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover
        pass
    return math.nan


def _run_erase_pipeline(
    shape: ModelShape,
    lora_rank: int,
    rank: int,
    seed: int,
    decomp: str,
    retain_rank: int | None,
    localized: bool,
    granularity: str,
    out_dir: str,
) -> dict:
    """The streaming pipeline, in-process. Two passes over the modules; at most one module's factors live at a time."""
    from ..method.discriminate import forget_update
    from ..method.energy import energy_from_norms, modules_for_layers, select_layers
    from ..method.erase import EraseAdapterWriter
    from ..method.lowrank import LowRank

    mods = shape.modules()
    t0 = time.perf_counter()
    gen_s = 0.0
    # pass 1: forget energy (eq. 14) and layer selection (eq. 15)
    norms = {}
    for idx, (name, d_out, d_in) in enumerate(mods):
        g = time.perf_counter()
        B, A = _factors(seed, 0, idx, d_out, d_in, lora_rank)
        gen_s += time.perf_counter() - g
        norms[name] = LowRank(B, A).fro_norm()
    energy = energy_from_norms(norms, granularity)
    selected_layers = select_layers(energy)
    chosen = set(modules_for_layers(selected_layers, norms, granularity)) if localized else set(norms)
    t_energy = time.perf_counter() - t0
    # pass 2: decompose forget & retain, discriminate, reconstruct, stream to the adapter
    k_eff = {name: min(rank, lora_rank, d_out, d_in) for name, d_out, d_in in mods}
    shapes = {name: (d_out, d_in, k_eff[name]) for name, d_out, d_in in mods if name in chosen}
    with EraseAdapterWriter(out_dir, shapes, f"random-{shape.name}") as w:
        for idx, (name, d_out, d_in) in enumerate(mods):
            if name not in chosen:
                continue
            g = time.perf_counter()
            f = _factors(seed, 0, idx, d_out, d_in, lora_rank)
            r_ = _factors(seed, 1, idx, d_out, d_in, lora_rank)
            gen_s += time.perf_counter() - g
            U, V = forget_update(f, r_, k_eff[name], decomp, retain_rank, 1.0, name=name)
            w.write(name, U, V)
    wall = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in Path(out_dir).iterdir())
    return {
        "shape": shape.name,
        "n_blocks": shape.n_blocks,
        "n_modules": len(mods),
        "n_layers_selected": len(selected_layers),
        "n_modules_written": len(shapes),
        "localized": localized,
        "lora_rank": lora_rank,
        "rank": rank,
        "decomp": decomp,
        "wall_s": wall,
        "energy_s": t_energy,
        "generate_s": gen_s,
        "adapter_mb": size / 2**20,
    }


def erase_child_main(argv: list[str]) -> None:  # pragma: no cover - exercised through a subprocess
    """Entry point of the benchmark's child interpreter: ``argv = [spec.json, result.json]``."""
    import resource

    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    base_rss = _vm_rss_mb()
    spec["shape"] = ModelShape(**spec["shape"])
    res = _run_erase_pipeline(**spec)
    res["baseline_rss_mb"] = base_rss
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    Path(argv[1]).write_text(json.dumps(res), encoding="utf-8")


def bench_whole_model_erase(
    shape: str | ModelShape = "llama3-8b",
    lora_rank: int = 16,
    rank: int = 16,
    seed: int = 0,
    *,
    decomp: str = "cpqr",
    retain_rank: int | None = None,
    localized: bool = False,
    granularity: str = "block",
    threads: int | None = None,
    isolate: bool = True,
    method: str | None = None,
) -> dict:
    """Wall time and peak RSS of the full QR-Erase pipeline on random adapters with a model's shapes.

    Parameters
    ----------
    shape : "llama3-8b" | "llama3-70b" | ModelShape
        Llama-3-8B: 32 blocks, hidden 4096, intermediate 14336, k/v 1024; 70B: 80, 8192, 28672, 1024.
    lora_rank, rank : int
        LoRA r of the random forget/retain adapters and the decomposition rank k (capped at r).
    seed : int
        Factors of module i of set s come from ``default_rng([seed, s, i])`` (float32; B ~ N(0, 1),
        A ~ N(0, 1/d_in)).
    decomp : {"cpqr", "svd"}
        The decomposition (``method``: its deprecated name, DeprecationWarning).
    localized : bool
        Write only the modules of the layers selected by eq. 15 (default: all modules, the worst case;
        energy and selection are computed either way).
    isolate : bool
        Run in a fresh child interpreter (``python -c``) and report ITS peak RSS
        (``getrusage(RUSAGE_SELF).ru_maxrss`` read by the child at the end: the high-water mark of the
        whole process, interpreter and numpy/scipy included; ``baseline_rss_mb`` is its RSS before the
        pipeline started). ``isolate=False`` runs in-process and reports NaN for memory.

    Returns
    -------
    dict
        shape, n_blocks, n_modules, n_layers_selected, n_modules_written, localized, lora_rank, rank,
        decomp, wall_s (pipeline only: both passes incl. factor generation and the adapter write),
        energy_s (pass 1), generate_s (time spent generating random factors), adapter_mb,
        baseline_rss_mb, peak_rss_mb, threads.
    """
    from ..method.decompose import resolve_decomp

    decomp = resolve_decomp(decomp, method, "bench_whole_model_erase")
    if isinstance(shape, str):
        if shape not in MODEL_SHAPES:
            raise ValueError(f"unknown model shape {shape!r}; choose from {sorted(MODEL_SHAPES)}")
        shape = MODEL_SHAPES[shape]
    spec = {
        "shape": dataclasses.asdict(shape),
        "lora_rank": int(lora_rank),
        "rank": int(rank),
        "seed": int(seed),
        "decomp": decomp,
        "retain_rank": retain_rank,
        "localized": bool(localized),
        "granularity": granularity,
    }
    with tempfile.TemporaryDirectory(prefix="qrerase-bench-") as tmp:
        spec["out_dir"] = str(Path(tmp) / "erase_adapter")
        if not isolate:
            s = dict(spec, shape=shape)
            res = _run_erase_pipeline(**s)
            res.update(baseline_rss_mb=math.nan, peak_rss_mb=math.nan)
        else:
            spec_path, res_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
            spec_path.write_text(json.dumps(spec), encoding="utf-8")
            env = dict(os.environ)
            if threads:
                for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                    env[var] = str(int(threads))
            code = (
                "import sys; from qrerase.bench.whole_model_erase import erase_child_main; "
                "erase_child_main(sys.argv[1:])"
            )
            proc = subprocess.run(
                [sys.executable, "-c", code, str(spec_path), str(res_path)], env=env, capture_output=True, text=True
            )
            if proc.returncode != 0:
                raise RuntimeError(f"whole-model erase benchmark ({shape.name}) failed:\n{proc.stderr[-4000:]}")
            res = json.loads(res_path.read_text(encoding="utf-8"))
    res["threads"] = int(threads) if threads else blas_threads()
    return res


def run_erase_benchmark(
    model_shapes: Iterable[str],
    out_csv: str | os.PathLike,
    *,
    lora_rank: int = 16,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[str], None] | None = None,
):
    """Run :func:`bench_whole_model_erase` for each shape (k = r) and write one CSV row per shape."""
    import pandas as pd

    rows = []
    for shape in model_shapes:
        if progress:
            progress(f"whole-model erase: {shape}")
        rows.append(bench_whole_model_erase(shape, lora_rank=lora_rank, rank=lora_rank, seed=seed, threads=threads))
    frame = pd.DataFrame(rows, columns=ERASE_COLUMNS)
    write_csv(out_csv, frame)
    return frame
