"""Decomposition-runtime benchmark (paper §6.1 table) + optional whole-model erase benchmark.

Thin driver around :mod:`qrerase.bench`. Two ways to run it:

- Snakemake ``script:`` — ``snakemake.params``: sizes, lora_rank, repeats, seed, threads, model_shapes
  (optional: max_dense_svd); ``snakemake.output``: csv, plot, table_csv, table_md, table_tex and
  erase_csv (whole-model erase benchmark over ``model_shapes``; each output is written only if declared).
- Standalone — ``python workflow_scripts/bench_decomposition.py --sizes 64 128 --out-dir X
  [--repeats 3 --seed 0 --lora-rank 16 --threads 2 --max-dense-svd 4096 --model-shapes llama3-8b]``
  writes X/decomposition.csv, X/decomposition.png, X/runtime_table.{csv,md,tex} (and X/erase.csv
  when --model-shapes is given).

Every file is written atomically; nothing is redirected (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import os
import sys


def _from_snakemake(sm) -> dict:
    p, o = sm.params, sm.output

    def get(obj, name, default=None):
        val = getattr(obj, name, None)
        if val is None:
            try:
                val = obj[name]
            except (KeyError, TypeError, IndexError):
                val = None
        return default if val is None else val

    return {
        "sizes": [int(s) for s in get(p, "sizes")],
        "lora_rank": int(get(p, "lora_rank", 16)),
        "repeats": int(get(p, "repeats", 3)),
        "seed": int(get(p, "seed", 0)),
        "threads": int(get(p, "threads", getattr(sm, "threads", 0) or 0)),
        "max_dense_svd": get(p, "max_dense_svd"),
        "model_shapes": list(get(p, "model_shapes", [])),
        "out": {k: get(o, k) for k in ("csv", "plot", "table_csv", "table_md", "table_tex", "erase_csv")},
    }


def _from_argv(argv) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="BLAS threads (0: leave as is)")
    ap.add_argument("--max-dense-svd", type=int, default=None, help="skip the dense SVD above this size")
    ap.add_argument("--model-shapes", nargs="*", default=[], help="also run the whole-model erase benchmark")
    a = ap.parse_args(argv)
    d = a.out_dir
    out = {
        "csv": os.path.join(d, "decomposition.csv"),
        "plot": os.path.join(d, "decomposition.png"),
        "table_csv": os.path.join(d, "runtime_table.csv"),
        "table_md": os.path.join(d, "runtime_table.md"),
        "table_tex": os.path.join(d, "runtime_table.tex"),
        "erase_csv": os.path.join(d, "erase.csv") if a.model_shapes else None,
    }
    return {
        "sizes": a.sizes,
        "lora_rank": a.lora_rank,
        "repeats": a.repeats,
        "seed": a.seed,
        "threads": a.threads,
        "max_dense_svd": a.max_dense_svd,
        "model_shapes": a.model_shapes,
        "out": out,
    }


def main(cfg: dict) -> None:
    if cfg["threads"]:
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(cfg["threads"])
    import pandas as pd

    from qrerase import bench
    from qrerase.io import write_csv

    bench.set_blas_threads(cfg["threads"])
    out = cfg["out"]
    say = lambda msg: print(f"[bench_decomposition] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    df = bench.bench_decomposition(
        cfg["sizes"],
        lora_rank=cfg["lora_rank"],
        repeats=cfg["repeats"],
        seed=cfg["seed"],
        max_dense_svd=None if cfg["max_dense_svd"] in (None, "", 0) else int(cfg["max_dense_svd"]),
        progress=say,
    )
    if out.get("csv"):
        write_csv(out["csv"], df)
    if out.get("plot"):
        bench.plot_decomposition(df, out["plot"])
    table = bench.runtime_table(df)
    if out.get("table_csv"):
        write_csv(out["table_csv"], table)
    if out.get("table_md"):
        from qrerase.io import write_text

        write_text(out["table_md"], bench.runtime_table_markdown(table))
    if out.get("table_tex"):
        from qrerase.io import write_text

        write_text(out["table_tex"], bench.runtime_table_latex(table))
    if out.get("erase_csv"):
        rows = []
        for shape in cfg["model_shapes"]:
            say(f"whole-model erase: {shape}")
            rows.append(bench.bench_whole_model_erase(shape, lora_rank=cfg["lora_rank"], rank=cfg["lora_rank"], seed=cfg["seed"], threads=cfg["threads"] or None))
        write_csv(out["erase_csv"], pd.DataFrame(rows, columns=bench.ERASE_COLUMNS))
    say("done")


if __name__ == "__main__":
    _sm = globals().get("snakemake")
    main(_from_snakemake(_sm) if _sm is not None else _from_argv(sys.argv[1:]))
