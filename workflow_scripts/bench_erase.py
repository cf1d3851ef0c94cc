"""Whole-model erase benchmark: wall time and peak RSS of the streaming QR-Erase pipeline.

Thin driver around :func:`qrerase.bench.bench_whole_model_erase` (random adapters with Llama-3-8B /
70B shapes; see its docstring for what is timed and how peak RSS is measured). Two ways to run it:

- Snakemake ``script:`` — ``snakemake.params``: model_shapes, lora_rank, seed, threads (optional: rank,
  method, localized); ``snakemake.output.erase_csv``.
- Standalone — ``python workflow_scripts/bench_erase.py --model-shapes llama3-8b llama3-70b --out X.csv
  [--lora-rank 16 --rank 16 --seed 0 --threads 2 --method cpqr --localized]``.
"""

from __future__ import annotations

import argparse
import os
import sys


def _cfg(argv) -> dict:
    sm = globals().get("snakemake")
    if sm is not None:
        p = sm.params

        def get(name, default=None):
            val = getattr(p, name, None)
            return default if val is None else val

        lr = int(get("lora_rank", 16))
        return {
            "model_shapes": list(get("model_shapes", [])),
            "lora_rank": lr,
            "rank": int(get("rank", lr)),
            "seed": int(get("seed", 0)),
            "threads": int(get("threads", getattr(sm, "threads", 0) or 0)),
            "method": get("method", "cpqr"),
            "localized": bool(get("localized", False)),
            "out": sm.output.erase_csv,
        }
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-shapes", nargs="+", default=["llama3-8b", "llama3-70b"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--method", choices=["cpqr", "svd"], default="cpqr")
    ap.add_argument("--localized", action="store_true")
    a = ap.parse_args(argv)
    return {
        "model_shapes": a.model_shapes,
        "lora_rank": a.lora_rank,
        "rank": a.rank or a.lora_rank,
        "seed": a.seed,
        "threads": a.threads,
        "method": a.method,
        "localized": a.localized,
        "out": a.out,
    }


def main(cfg: dict) -> None:
    if cfg["threads"]:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(cfg["threads"])
    import pandas as pd

    from qrerase import bench
    from qrerase.io import write_csv

    rows = []
    for shape in cfg["model_shapes"]:
        print(f"[bench_erase] {shape}", file=sys.stderr, flush=True)
        rows.append(
            bench.bench_whole_model_erase(
                shape,
                lora_rank=cfg["lora_rank"],
                rank=cfg["rank"],
                seed=cfg["seed"],
                method=cfg["method"],
                localized=cfg["localized"],
                threads=cfg["threads"] or None,
            )
        )
    write_csv(cfg["out"], pd.DataFrame(rows, columns=bench.ERASE_COLUMNS))


if __name__ == "__main__":
    main(_cfg(sys.argv[1:]))
