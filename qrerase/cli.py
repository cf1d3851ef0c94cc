"""Command line: ``qrerase <command>``.

- ``qrerase metrics LOG [--reference REF]``: TOFU metrics (Model Utility, Forget Quality and the twelve
  components) of a TOFU-format eval log (an ``eval_log_aggregated.json`` file or a directory with
  the four per-set files), printed as CSV.
- ``qrerase bench --sizes 768 2048 --out-dir DIR [--model-shapes llama3-8b]``: the decomposition
  runtime benchmark (and the whole-model erase benchmark), outside Snakemake.
- ``qrerase factors FORGET_ADAPTER RETAIN_ADAPTER --rank K``: the per-module factor report of
  :func:`qrerase.method.diagnostics.factor_report` (energy, rank-k errors, CPQR-vs-SVD angles) as CSV.
- ``qrerase audit results/``: re-hash every artifact with a provenance record and check every record,
  every input → output link and the manifest (:func:`qrerase.workflow.manifest.audit`); exit status 0 when
  all hold, 1 with one line per broken artifact (path: why) otherwise. ``results/`` may be a symlink
  (results on scratch); record paths are relative to the working directory, the folder holding
  ``results/`` as written (:func:`qrerase.workflow.manifest.workdir_of`), or ``--workdir DIR``.
  ``--verify-signature --allowed-signers FILE --identity NAME`` also checks the manifest's signature;
  ``--remove-broken`` deletes each broken artifact and what was made from it, so that a plain rerun
  remakes them (:func:`qrerase.workflow.manifest.remove_broken`).
- ``qrerase sign results/ --key ~/.ssh/id_ed25519``: sign ``results/provenance/manifest.json`` with an
  SSH key (``ssh-keygen -Y sign``, :mod:`qrerase.workflow.signature`), writing ``manifest.json.sig``.
- ``qrerase manifest results/ TARGET...``: print the artifact graph behind the targets as JSON
  (``--workdir`` as for the audit).
- ``qrerase plan --configfile X``: per job kind, GPUs, micro-batch, peak memory per GPU and host
  (:mod:`qrerase.workflow.plan_config`), as a Markdown table; exits 2 after it, with one line naming
  the job and the config key to change, when a job does not fit (``plan_config.refusal``).
- ``qrerase config-docs [--out docs/configuration.md] [--check]``: write the configuration reference
  generated from the schema (:mod:`qrerase.workflow.config_docs`); ``--check`` writes nothing and
  exits 1 when the file differs from a fresh render.
- ``qrerase results-pages [RESULTS] [--out docs/results] [--commit C] [--date D] [--note TEXT]
  [--compare OTHER_RESULTS --compare-label TEXT] [--plugins MODULE ...]``: the
  docs site's results pages from a finished ``results/`` (:mod:`qrerase.reports.pages`): one page per
  track with its tables, figures and a header (commit, date, CPU, versions) read from the run's
  provenance records; with ``--compare``, how far each table's numbers move against another run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _metrics(args: argparse.Namespace) -> int:
    from .metrics.log_metrics import metrics_frame
    from .text.eval_log import load_log

    log = load_log(args.log)
    ref = load_log(args.reference) if args.reference else None
    frame = metrics_frame(log, ref, model=args.name or str(args.log))
    frame.to_csv(sys.stdout, index=False, float_format="%.6g")
    return 0


def _factors(args: argparse.Namespace) -> int:
    from .method.adapters import task_matrices
    from .method.diagnostics import factor_report

    forget = task_matrices(args.forget)
    retain = task_matrices(args.retain)
    report = factor_report(forget, retain, args.rank, energy_granularity=args.granularity)
    report.to_csv(sys.stdout, index=False, float_format="%.6g")
    return 0


def _bench(args: argparse.Namespace) -> int:
    import os

    from .bench.decomposition import run_decomposition_benchmark
    from .bench.threads import set_blas_threads
    from .bench.whole_model_erase import run_erase_benchmark

    set_blas_threads(args.threads)
    out = args.out_dir
    say = lambda msg: print(f"[qrerase bench] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    run_decomposition_benchmark(
        args.sizes,
        os.path.join(out, "decomposition.csv"),
        os.path.join(out, "decomposition.png"),
        os.path.join(out, "runtime.csv"),
        os.path.join(out, "runtime.md"),
        os.path.join(out, "runtime.tex"),
        lora_rank=args.lora_rank,
        repeats=args.repeats,
        seed=args.seed,
        max_dense_svd=args.max_dense_svd,
        progress=say,
    )
    if args.model_shapes:
        run_erase_benchmark(
            args.model_shapes,
            os.path.join(out, "erase.csv"),
            lora_rank=args.lora_rank,
            seed=args.seed,
            threads=args.threads or None,
            progress=say,
        )
    return 0


def _manifest_file(results: str) -> Path:
    from .workflow.provenance import MANIFEST

    return Path(results) / Path(MANIFEST).relative_to("results")


def _audit(args: argparse.Namespace) -> int:
    from .workflow.manifest import audit, remove_broken, workdir_of
    from .workflow.provenance import Problem
    from .workflow.signature import verify_manifest

    if args.verify_signature and not (args.allowed_signers and args.identity):
        raise ValueError("--verify-signature needs --allowed-signers FILE and --identity NAME")
    problems, counts = audit(args.results, args.workdir)
    for problem in problems:
        print(f"BROKEN {problem}")
    summary = (
        f"{counts['records']} records, {counts['artifacts']} artifacts re-hashed, "
        f"{counts.get('manifest_artifacts', 0)} manifest entries checked"
    )
    if args.verify_signature and not _manifest_file(args.results).is_file():
        print(f"BROKEN {_manifest_file(args.results)}: the signed manifest is missing")
        problems = [*problems, Problem(str(_manifest_file(args.results)), "the signed manifest is missing")]
    elif args.verify_signature:
        try:
            good = verify_manifest(_manifest_file(args.results), args.allowed_signers, args.identity)
            summary += f"; {good}"
        except ValueError as exc:
            print(f"BROKEN {exc}")
            problems = [*problems, Problem(str(_manifest_file(args.results)), str(exc))]
    if problems and args.remove_broken:
        root = Path(args.workdir) if args.workdir else workdir_of(args.results)
        removed = remove_broken(problems, root)
        for path in removed:
            print(f"removed {path}")
        print(
            f"qrerase audit: removed {len(removed)} broken artifact(s) and what was made from them, with their "
            "records; the same snakemake command remakes them",
            file=sys.stderr,
        )
    if problems:
        print(f"qrerase audit: {len(problems)} problem(s); {summary}", file=sys.stderr)
        return 1
    print(f"qrerase audit: OK; {summary}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from .workflow.signature import sign_manifest

    print(sign_manifest(_manifest_file(args.results), args.key))
    return 0


def _manifest(args: argparse.Namespace) -> int:
    import json

    from .workflow.manifest import build_manifest, workdir_of

    if not Path(args.results).is_dir():
        raise FileNotFoundError(f"{args.results}: not a directory")
    root = Path(args.workdir) if args.workdir else workdir_of(args.results)
    manifest = build_manifest(args.targets, root=root)
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from .workflow.plan_config import format_table, load_config, refusal

    cfg = load_config(*args.configfile, jobs=False)  # a bad config: ConfigError (a ValueError), one line
    print(f"# qrerase plan --configfile {' '.join(map(str, args.configfile))}")
    print(format_table(cfg))
    refused = refusal(cfg)  # a job that does not fit: the table, then one line naming it and the key
    if refused:
        raise ValueError(refused)
    return 0


def _smoke(args: argparse.Namespace) -> int:
    from .smoke import run_smoke
    from .workflow.plan_config import load_config

    cfg = load_config(*args.configfile, jobs=False)  # smoke builds a random-weight model: no hub model needed
    rows = run_smoke(cfg, args.out, args.work, steps=args.steps, only=tuple(args.only))
    for r in rows:
        print(
            f"{r['job']}: {r['backend']} x{r['processes']}, micro-batch {r['micro_batch']}, "
            f"plan {r['plan_gib']:.3g} GiB, measured {r['measured_gib']:.3g} GiB ({r['device']})"
        )
    print(f"wrote {args.out}")
    return 0


def _config_docs(args: argparse.Namespace) -> int:
    from .workflow.config_docs import generate, write

    text = generate(args.schema, args.defaults)
    out = Path(args.out)
    if args.check:
        if not out.is_file() or out.read_text(encoding="utf-8") != text:
            print(f"qrerase config-docs: {out} is stale; run `qrerase config-docs --out {out}`", file=sys.stderr)
            return 1
        return 0
    write(out, text)
    return 0


def _results_pages(args: argparse.Namespace) -> int:
    from .registry import load_plugins
    from .reports.pages import write_pages

    load_plugins(args.plugins)  # their metrics (the notes under the tables with their columns), tracks (pages)

    for path in write_pages(
        args.results,
        args.out,
        commit=args.commit,
        date=args.date,
        note=args.note,
        compare=args.compare,
        compare_label=args.compare_label,
    ):
        print(path)
    return 0


def _run_profile(args: argparse.Namespace) -> int:
    from .bench.run_profile import run_profile, write_profile

    try:
        rows = run_profile(args.results)
    except ValueError as exc:
        print(f"qrerase run-profile: {exc}", file=sys.stderr)
        return 2
    out = args.out or str(Path(args.results) / "bench" / "run_profile.csv")
    write_profile(rows, out)
    print(out)
    return 0


def _size_study_figure(args: argparse.Namespace) -> int:
    import pandas as pd

    from .reports.size_study import read_markdown_table, size_study_plot

    text = Path(args.table).read_text(encoding="utf-8")
    agg = pd.read_csv(args.table) if args.table.endswith(".csv") else read_markdown_table(text)
    fits = pd.read_csv(args.trend) if args.trend else pd.DataFrame(columns=["method"])
    extra = None
    if args.point:
        label, params, csv = args.point
        extra = pd.read_csv(csv).assign(params=int(params))
        extra = extra[extra["method"].isin(set(agg["method"]))]
    size_study_plot(
        agg, fits, args.out, title=args.title, extra=extra, extra_label=args.point[0] if args.point else None
    )
    print(args.out)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qrerase", description="QR-Erase: subspace-based machine unlearning")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("metrics", help="Model Utility, Forget Quality and their components of an eval log (CSV)")
    p.add_argument("log", help="eval_log_aggregated.json, or a directory holding the four eval_*.json files")
    p.add_argument("--reference", help="the retain-only reference model's log (for Forget Quality)")
    p.add_argument("--name", help="model name for the 'model' column")
    p.set_defaults(func=_metrics)

    p = sub.add_parser("factors", help="CPQR/SVD diagnostics of a forget/retain LoRA adapter pair")
    p.add_argument("forget", help="forget-set PEFT LoRA adapter directory")
    p.add_argument("retain", help="retain-set PEFT LoRA adapter directory")
    p.add_argument("--rank", type=int, required=True, help="k")
    p.add_argument("--granularity", choices=["block", "module"], default="block")
    p.set_defaults(func=_factors)

    p = sub.add_parser("bench", help="decomposition runtime (and whole-model erase) benchmark")
    p.add_argument("--sizes", type=int, nargs="+", required=True, help="square matrix sizes n")
    p.add_argument("--out-dir", required=True)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="BLAS threads (0: leave as is)")
    p.add_argument("--max-dense-svd", type=int, default=None, help="skip the dense SVD above this size")
    p.add_argument("--model-shapes", nargs="*", default=[], choices=["llama3-8b", "llama3-70b"])
    p.set_defaults(func=_bench)

    p = sub.add_parser("audit", help="re-hash artifacts and check every provenance record and link")
    p.add_argument("results", help="the workflow's results/ directory (a symlink to scratch is fine)")
    p.add_argument("--workdir", help="the Snakemake working directory (default: the parent of RESULTS as written)")
    p.add_argument(
        "--verify-signature",
        action="store_true",
        help="also check provenance/manifest.json.sig (qrerase sign) with ssh-keygen -Y verify",
    )
    p.add_argument("--allowed-signers", help="OpenSSH allowed-signers file: 'NAME <public key>' lines")
    p.add_argument("--identity", help="the signer's NAME in the allowed-signers file")
    p.add_argument(
        "--remove-broken",
        action="store_true",
        help="delete each broken artifact and everything made from it (with their records), so that the same "
        "snakemake command remakes them; exit status 1 still reports that the run was broken",
    )
    p.set_defaults(func=_audit)

    p = sub.add_parser("sign", help="sign the provenance manifest with an SSH key (ssh-keygen -Y sign)")
    p.add_argument("results", help="the workflow's results/ directory")
    p.add_argument("--key", required=True, help="SSH private key, e.g. ~/.ssh/id_ed25519")
    p.set_defaults(func=_sign)

    p = sub.add_parser("manifest", help="the artifact graph behind targets (JSON on stdout)")
    p.add_argument("results", help="the workflow's results/ directory (a symlink to scratch is fine)")
    p.add_argument("--workdir", help="the Snakemake working directory (default: the parent of RESULTS as written)")
    p.add_argument("targets", nargs="+", help="artifact paths relative to the working directory")
    p.set_defaults(func=_manifest)

    p = sub.add_parser("plan", help="memory / GPU plan of a config's jobs (nothing is downloaded)")
    p.add_argument("--configfile", nargs="+", required=True, help="config file(s) over the embedded config.yaml")
    p.set_defaults(func=_plan)

    p = sub.add_parser(
        "smoke", help="run each training job a few steps on a random model of the config's shape: peak memory vs plan"
    )
    p.add_argument("--configfile", nargs="+", required=True, help="config file(s) over the embedded config.yaml")
    p.add_argument("--out", default="results/smoke/smoke.csv", help="the CSV (default: results/smoke/smoke.csv)")
    p.add_argument(
        "--work", default="results/smoke", help="random checkpoint and per-rank records (default: results/smoke)"
    )
    p.add_argument("--steps", type=int, default=3, help="optimiser steps per job (default: 3)")
    p.add_argument(
        "--only", nargs="+", default=[], help="stage names to run (finetune, lora, a baseline; default: all)"
    )
    p.set_defaults(func=_smoke)

    p = sub.add_parser("config-docs", help="write the configuration reference generated from the schema")
    p.add_argument("--out", default="docs/configuration.md", help="the Markdown file (default: docs/configuration.md)")
    p.add_argument("--schema", default=None, help="schema file (default: the package's config.schema.yaml)")
    p.add_argument("--defaults", default="config.yaml", help="config whose values fill the Default column")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 when OUT differs from a fresh render")
    p.set_defaults(func=_config_docs)

    p = sub.add_parser("results-pages", help="the docs' results pages (docs/results/*.md) from a finished results/")
    p.add_argument("results", nargs="?", default="results", help="the workflow's results/ directory (default: results)")
    p.add_argument("--out", default="docs/results", help="folder of the pages (default: docs/results)")
    p.add_argument("--commit", help="the commit to state (default: the one the run's provenance records hold)")
    p.add_argument("--date", help="the date to state, YYYY-MM-DD (default: when the run's table jobs finished)")
    p.add_argument("--note", help="a sentence shown under each page's header (e.g. which config ran)")
    p.add_argument("--compare", help="another run's results/ (another machine or seed): show how far each table moves")
    p.add_argument("--compare-label", default="the other run", help="how the pages name the --compare run")
    p.add_argument("--plugins", nargs="*", default=[], help="the config key `plugins` (modules registering metrics)")
    p.set_defaults(func=_results_pages)

    p = sub.add_parser("run-profile", help="a finished run's CPU per rule: start-up, loading, hashing, work (CSV)")
    p.add_argument("results", nargs="?", default="results", help="the workflow's results/ directory (default: results)")
    p.add_argument("--out", help="the CSV (default: <results>/bench/run_profile.csv)")
    p.set_defaults(func=_run_profile)

    p = sub.add_parser(
        "size-study-figure", help="the size study's figure from its table, with another model's points (e.g. a real LM)"
    )
    p.add_argument("--table", required=True, help="size_study.csv, or a size_study.md / a docs page that quotes it")
    p.add_argument("--trend", help="size_study_trend.csv (its dashed fits; default: none drawn)")
    p.add_argument(
        "--point",
        nargs=3,
        metavar=("LABEL", "PARAMS", "SELECTIVITY_CSV"),
        help="a model outside the ladder: its label, parameter count and <track>_selectivity.csv (stars)",
    )
    p.add_argument("--title", default="Size study: selectivity and Forget Quality vs parameters")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.set_defaults(func=_size_study_figure)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"qrerase {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
