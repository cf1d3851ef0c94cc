"""End-to-end: the Snakemake workflow on the small test config, through the real snakemake CLI."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from support import REPO
from support.localslurm import requested, slurm  # noqa: F401 (slurm: a fixture)
from support.snakemake_cli import assert_config_error, build_report, kill_run, planned_rules, snakemake, write_config

pytestmark = pytest.mark.workflow

METHODS = ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll"]
#: tests/configs/test.yaml's baselines, in table order: ga, npo, simnpo, rmu, undial
BASELINES = [
    m for m in yaml.safe_load((REPO / "tests/configs/test.yaml").read_text())["methods"]["tofu"] if m not in METHODS
]
CONTROLS = ["qr_erase_ll_control"]  # config.yaml unlearn.control: the same edit built from the retain adapter


def copy_checkout(dest: Path) -> Path:
    """A git checkout at ``dest`` holding this checkout's workflow files as they are now (tracked and
    untracked-but-not-ignored; no docs, tests or the large data sets), committed (provenance records a
    commit)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    skip = ("docs/", "tests/", "data/fsdd/", "data/mtofu/")
    for name in filter(None, listed.split("\0")):
        src = REPO / name
        if name.startswith(skip) or not src.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / name, follow_symlinks=False)
    git = ["git", "-C", str(dest), "-c", "user.name=test", "-c", "user.email=test@example.org"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "copy"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return dest


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The e2e run of the test config, in a copy of the checkout whose path has a space and a non-ASCII
    letter, run there (workflow directory = working directory). The other tests plan against it with
    this checkout's Snakefile: the checkout the run used is elsewhere, and nothing may re-run for it."""
    wd = copy_checkout(tmp_path_factory.mktemp("workflow") / "my runs" / "qr-érase")
    cfg = run_config(wd)
    snakemake(wd, "--cores", "2", "--configfile", str(cfg), repo=wd)
    return wd


def run_config(workdir: Path, name: str = "test.yaml", **overrides) -> Path:
    """The e2e run's config: test.yaml with the vendored TOFU files copied into workdir (relative
    root, so a test can edit them) and one imported TOFU log."""
    if not (workdir / "data" / "tofu").is_dir():
        shutil.copytree(REPO / "data" / "tofu", workdir / "data" / "tofu")
    logs = REPO / "data" / "tofu_reference_logs"
    imported = [
        {
            "name": "llama2_7b_full",
            "label": "Llama-2-7B full (TOFU log)",
            "log": str(logs / "ft_epoch5_lr1e-05_llama2-7b_full_wd0.01.json"),
            "reference": str(logs / "ft_epoch5_lr1e-05_llama2-7b_retain90_wd0.01.json"),
        }
    ]
    return write_config(workdir, name, tofu__imported_models=imported, tofu__data__root="data/tofu", **overrides)


def test_tofu_table_has_every_model_with_real_numbers(workdir):
    table = pd.read_csv(workdir / "results/tables/tofu.csv")
    assert list(table["method"]) == ["base", "retain", "llama2_7b_full", *CONTROLS, *BASELINES, *METHODS]
    imported = table.set_index("method").loc["llama2_7b_full"]
    assert round(imported["model_utility"], 4) == 0.6227 and imported["forget_quality"] < 1e-10
    table = table[table["method"] != "llama2_7b_full"]
    assert table["model_utility"].between(0, 1).all() and (table["model_utility"] > 0).all()
    fq = table.set_index("method")["forget_quality"]
    assert pd.isna(fq["retain"])  # the reference is not compared with itself
    assert fq.drop("retain").between(0, 1).all()
    md = (workdir / "results/tables/tofu.md").read_text()
    tex = (workdir / "results/tables/tofu.tex").read_text()
    for label in ("Base Model", "UNLEARN (LL)", "QR-Erase (LL)", "Gradient Ascent", "NPO", "SimNPO", "RMU", "UNDIAL"):
        assert label in md
    assert "\\begin{tabular}" in tex and "Forget Quality" in tex
    assert "Llama-2-7B full (TOFU log)" in md
    wide = pd.read_csv(workdir / "results/tables/tofu_wide.csv")
    assert {"retain_probability", "world_facts_rougeL", "forget_truth_ratio"} <= set(wide.columns)
    # selectivity diagnostic: answer-NLL change against the base model, per set, for every row
    dnll = wide.set_index("method")[["forget_dnll", "retain_dnll"]]
    assert (dnll.loc["base"] == 0).all() and dnll.loc[
        "retain", "forget_dnll"
    ] > 1  # the reference never saw the forget set
    assert dnll.loc[[*METHODS, *CONTROLS]].notna().all().all()
    # privacy columns: from each model's sequence_metrics.json; none for the imported log; the reference's PrivLeak is 0
    full = pd.read_csv(workdir / "results/tables/tofu.csv").set_index("method")
    assert full.loc["llama2_7b_full", ["privleak", "mia_min_k_plus_plus"]].isna().all()
    assert full.loc["retain", "privleak"] == 0 and full["mia_min_k_plus_plus"].dropna().between(0, 1).all()
    seq = json.loads((workdir / "results/tofu_forget10/eval/base/sequence_metrics.json").read_text())["metrics"]
    assert full.loc["base", "mia_min_k_plus_plus"] == seq["mia_min_k_plus_plus"]


def test_metrics_recompute_from_the_written_logs(workdir):
    from qrerase.metrics.log_metrics import forget_quality, model_utility
    from qrerase.text.eval_log import load_log

    table = pd.read_csv(workdir / "results/tables/tofu.csv").set_index("method")
    ref = load_log(workdir / "results/tofu_forget10/eval/retain")
    for method in [*METHODS, *BASELINES]:
        model = method if method in BASELINES else f"{method}_k2"
        log = load_log(workdir / f"results/tofu_forget10/eval/{model}")
        assert model_utility(log) == pytest.approx(table.loc[method, "model_utility"], rel=1e-9)
        assert forget_quality(log, ref) == pytest.approx(table.loc[method, "forget_quality"], rel=1e-9)
        assert len(log["eval_log_forget.json"]["avg_gt_loss"]) == 20  # one forget author


def test_layer_localised_erase_touches_only_selected_layers(workdir):
    exp = workdir / "results/tofu_forget10"
    selected = json.loads((exp / "energy/selected_layers.json").read_text())
    energy = pd.read_csv(exp / "energy/energy.csv")
    assert energy["energy"].sum() == pytest.approx(1.0)
    assert sorted(energy.loc[energy["selected"], "layer"].astype(str)) == sorted(map(str, selected["layers"]))
    for method, full in (("qr_erase", True), ("qr_erase_ll", False)):
        cfg = json.loads((exp / f"erase/k2/{method}/adapter/adapter_config.json").read_text())
        targets = set(cfg["target_modules"])
        if full:
            assert len(targets) == 2 * 7  # 2 blocks x 7 projections
        else:
            assert targets == set(selected["modules"])
    report = pd.read_csv(exp / "factors/k2/report.csv")
    assert (report["max_sin_theta_qr_vs_svd"] <= 1).all() and len(report) == 2 * 14


def test_baselines_unlearn_with_curves_and_costs(workdir):
    exp = workdir / "results/tofu_forget10"
    base = load_log_frame(exp / "eval/base")
    for method in BASELINES:
        curve = pd.read_csv(exp / f"baselines/{method}_loss.csv")
        assert len(curve) == 2 * 3 and curve["step"].tolist() == list(range(1, 7))  # 2 epochs x ceil(20 / 8)
        by_epoch = curve.groupby("epoch").mean()  # each epoch covers the whole forget set (a step: one batch)
        if method == "rmu":  # its loss runs no LM head: it logs the forget activations' distance to c u
            assert by_epoch["forget_mse"].iloc[-1] < by_epoch["forget_mse"].iloc[0]
        elif method == "simnpo":  # the under-fit test model's forget NLL (~3 nats / token) saturates SimNPO's
            # term at the reference beta 4.5: (2 / beta) softplus(-beta x 3) ~ 1e-6 (active on a model that
            # memorised its answers: test_new_baselines.py); the eval below still checks the forget NLL
            assert curve["simnpo"].max() < 1e-3
        else:
            assert by_epoch["forget_nll"].iloc[-1] > by_epoch["forget_nll"].iloc[0]
        files = {p.name for p in (exp / f"baselines/{method}/model").iterdir()}
        assert "model.safetensors" in files and "config.json" in files and not any(f.endswith(".bin") for f in files)
        # evaluated on the model the rule wrote: the forget answers got less likely than in the base model
        assert load_log_frame(exp / f"eval/{method}") > base
    costs = pd.read_csv(workdir / "results/tables/tofu_cost.csv").set_index("method")
    assert list(costs.index) == [*BASELINES, *METHODS]
    assert (costs.loc[BASELINES, "baseline_s"] > 0).all() and costs.loc[BASELINES, "erase_s"].isna().all()
    assert (costs.loc[METHODS, ["lora_s", "task_matrices_s", "erase_s"]] > 0).all().all()
    assert costs.loc[METHODS, "baseline_s"].isna().all()
    sub = costs.loc[METHODS]
    assert ((sub["total_s"] - sub[["lora_s", "task_matrices_s", "erase_s"]].sum(axis=1)).abs() < 1e-9).all()
    assert (costs["unlearn_s"] == costs["baseline_s"].fillna(costs["erase_s"])).all()
    md = (workdir / "results/tables/tofu_cost.md").read_text()
    assert "Closed-form erase (s)" in md and "Gradient Ascent" in md
    assert (workdir / "results/benchmarks/baseline/tofu_forget10_npo.tsv").is_file()


def load_log_frame(directory: Path) -> float:
    """Mean forget-set answer NLL of an eval log."""
    from qrerase.text.eval_log import load_log

    losses = load_log(directory)["eval_log_forget.json"]["avg_gt_loss"]
    return float(pd.Series(list(losses.values()) if isinstance(losses, dict) else losses).mean())


def test_benchmark_target(workdir):
    snakemake(workdir, "bench", "--cores", "2", "--configfile", str(workdir / "test.yaml"))
    runtime = pd.read_csv(workdir / "results/tables/runtime.csv")
    assert len(runtime) == 2  # sizes 64 and 128 in the test config
    decomposition = pd.read_csv(workdir / "results/bench/decomposition.csv")
    assert decomposition["pivots_identical_first_r"].all()
    assert (decomposition["max_sin_theta"] < 1e-10).all()


def test_nothing_changed_nothing_runs(workdir):
    # planned with this checkout's Snakefile, not the copy's that ran: a checkout elsewhere re-runs nothing
    proc = snakemake(workdir, "-n", "--cores", "2", "--configfile", str(workdir / "test.yaml"))
    assert planned_rules(proc) == {}


def test_a_moved_checkout_with_its_results_reruns_nothing(workdir):
    """The finished run's checkout (its working directory, results and .snakemake) renamed: nothing to do."""
    moved = workdir.parent / "moved qr-érase"
    workdir.rename(moved)
    try:
        proc = snakemake(moved, "-n", "--cores", "2", "--configfile", str(moved / "test.yaml"), repo=moved)
        assert planned_rules(proc) == {}, (proc.stdout + proc.stderr)[-3000:]
    finally:
        moved.rename(workdir)


def test_changing_rank_reruns_no_training(workdir):
    cfg = run_config(workdir, "rank1.yaml", unlearn__rank=1)
    proc = snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg))
    rules = planned_rules(proc)
    assert rules.get("factors") == 4 and rules.get("tofu_table") == 1 and rules.get("evaluate") == 4 + len(CONTROLS)
    assert not {"tofu_data", "tokenizer", "pretrain", "finetune", "lora", "task_matrices", "baseline"} & set(rules)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"methods": {"tofu": ["qr_erase", "magic"]}}, "config key 'methods.tofu.1'"),
        ({"unlearn__rank": 9}, "exceeds the LoRA rank"),
        ({"tofu__data__root": "/no/such/dir"}, "data file /no/such/dir/forget10.jsonl not found"),
        ({"tofu__data__n_authors": 1}, "config key 'tofu.data.n_authors'"),
        (
            {"tofu__baselines__npo": None},
            "config key 'methods.tofu.1': baseline 'npo' has no 'tofu.baselines.npo' settings",
        ),
        ({"tofu__baselines__npo__gamma": 1}, "config key 'tofu.baselines.npo.gamma': unknown key"),
        ({"tofu__baselines__npo__beta": 0}, "config key 'tofu.baselines.npo.beta'"),
        (
            {"tofu__baselines__refusals": "/no/such/idk.txt"},
            "config key 'tofu.baselines.refusals': /no/such/idk.txt not found",
        ),
        ({"resources__train__processes": 0}, "config key 'resources.train.processes': 0 is less than the minimum of 1"),
        ({"finetune__mode": "lorax"}, "config key 'finetune.mode'"),
    ],
)
def test_bad_config_fails_at_dag_construction(tmp_path, overrides, message):
    assert_config_error(tmp_path, write_config(tmp_path, **overrides), message)


# ---------------------------------------------------------------------------------------------
# Provenance, audit, report, incremental reruns, cluster execution, determinism.
# ---------------------------------------------------------------------------------------------
TRAINING = {"tofu_data", "tokenizer", "pretrain", "finetune"}
EXP = "results/tofu_forget10"


def qrerase_cli(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "qrerase.cli", *args], cwd=workdir, env=env, capture_output=True, text=True, timeout=600
    )


def test_run_profile_splits_each_rule_s_cpu_from_the_run_s_own_logs(workdir, tmp_path):
    # the README's profile command on the real run: a row per benchmarked rule, the job logs' CPU lines
    # behind the split, and nothing written into the run it reads
    out = tmp_path / "run_profile.csv"
    proc = qrerase_cli(workdir, "run-profile", "results", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    profile = pd.read_csv(out).set_index("rule")
    rules = {p.name for d in ("benchmarks", "logs") for p in (workdir / "results" / d).iterdir() if p.is_dir()}
    assert set(profile.index) == rules | {"total"}
    body = profile.drop(index="total")
    assert profile.loc["total", "jobs"] == body["jobs"].sum()
    # the CSV writes seconds to 0.1, so a sum of n written values may differ from its written total by
    # up to 0.05 per value plus 0.05 for the total
    assert profile.loc["total", "cpu_s"] == pytest.approx(body["cpu_s"].sum(), abs=0.05 * (len(body) + 1) + 1e-9)
    evaluate = profile.loc["evaluate"]
    assert evaluate["split_jobs"] == evaluate["jobs"] > 0  # every evaluation logs its split
    assert evaluate["startup_s"] > 0 and evaluate["load_s"] > 0 and evaluate["work_s"] > 0
    # an evaluation's CPU is its job process's own total, of which the split is a part
    assert evaluate["startup_s"] + evaluate["load_s"] + evaluate["record_s"] + evaluate["work_s"] == pytest.approx(
        evaluate["cpu_s"], abs=0.05 * 5 + 1e-9
    )
    assert not (workdir / "results/bench/run_profile.csv").exists()


def test_every_output_has_a_provenance_record_and_the_audit_passes(workdir):
    manifest = json.loads((workdir / "results/provenance/manifest.json").read_text())
    assert "results/tables/tofu.csv" in manifest["targets"]
    produced = {p: a for p, a in manifest["artifacts"].items() if a["rule"]}
    assert {a["rule"] for a in produced.values()} >= {
        "tofu_data",
        "tokenizer",
        "pretrain",
        "finetune",
        "lora",
        "task_matrices",
        "factors",
        "energy",
        "forget_update",
        "forget_update_control",
        "erase_adapter",
        "erase_merged",
        "evaluate",
        "tofu_metrics",
        "tofu_table",
        "factor_report",
    }
    # both fine-tuned models start from the pretrained checkpoint (rule pretrain)
    for which in ("full", "retain"):
        assert {
            "from": f"{EXP}/models/pretrained",
            "to": f"{EXP}/models/{which}",
            "sha256": produced[f"{EXP}/models/pretrained"]["sha256"],
        } in manifest["edges"]
    assert "data/tofu/forget10.jsonl" in manifest["artifacts"]  # a source file (relative data root)
    assert {
        "from": f"{EXP}/models/full",
        "to": f"{EXP}/lora/forget",
        "sha256": produced[f"{EXP}/models/full"]["sha256"],
    } in manifest["edges"]
    lora = json.loads((workdir / "results/provenance/records/tofu_forget10/lora/forget.json").read_text())
    assert lora["rule"] == "lora" and lora["wildcards"] == {"exp": "tofu_forget10", "set": "forget"}
    assert set(lora["config"]) == {"lora", "model", "seed"} and lora["config"]["lora"]["r"] == 4
    assert lora["seed"] == 0 and lora["threads"] == 1  # tests/configs/test.yaml threads
    assert {i["path"] for i in lora["inputs"]} == {f"{EXP}/models/full", f"{EXP}/data/forget.jsonl"}
    assert re.fullmatch(r"[0-9a-f]{40}", lora["code"]["git_commit"]) and isinstance(lora["code"]["git_dirty"], bool)
    assert {"python", "torch", "transformers", "peft", "scipy", "numpy", "snakemake"} <= set(lora["versions"])
    assert lora["start"] <= lora["end"]
    factors = json.loads(
        (workdir / "results/provenance/records/tofu_forget10/factors/k2/cpqr_forget.safetensors.json").read_text()
    )
    assert (
        factors["config"] == {"unlearn.rank": 2}
        and factors["outputs"][0]["sha256"]
        == hashlib.sha256((workdir / f"{EXP}/factors/k2/cpqr_forget.safetensors").read_bytes()).hexdigest()
    )
    table = json.loads((workdir / "results/provenance/records/tables/tofu.csv.json").read_text())
    assert table["config"]["tofu.data.split"] == "forget10"  # read by the script from snakemake.config
    proc = qrerase_cli(workdir, "audit", "results")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "qrerase audit: OK" in proc.stdout


def test_audit_names_tampered_artifacts(workdir, tmp_path):
    shutil.copytree(workdir / "results", tmp_path / "results")
    shutil.copytree(workdir / "data", tmp_path / "data")
    assert qrerase_cli(tmp_path, "audit", "results").returncode == 0
    with (tmp_path / "results/tables/tofu.csv").open("a") as fh:
        fh.write("forged,1,1\n")
    weights = tmp_path / f"{EXP}/erase/k2/qr_erase/model/model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit in the last tensor
    weights.write_bytes(bytes(data))
    factor = tmp_path / f"{EXP}/factors/k2/svd_retain.safetensors"
    shutil.copy(tmp_path / f"{EXP}/factors/k2/svd_forget.safetensors", factor)
    proc = qrerase_cli(tmp_path, "audit", "results")
    assert proc.returncode == 1
    broken = proc.stdout
    assert "BROKEN results/tables/tofu.csv: modified" in broken
    assert f"BROKEN {EXP}/erase/k2/qr_erase/model: modified" in broken
    assert (
        f"BROKEN {EXP}/eval/qr_erase_k2: produced from input {EXP}/erase/k2/qr_erase/model whose hash no longer matches"
        in broken
    )
    assert f"BROKEN {EXP}/factors/k2/svd_retain.safetensors: modified" in broken
    assert (
        f"BROKEN {EXP}/updates/k2/svd.safetensors: produced from input {EXP}/factors/k2/svd_retain.safetensors"
        in broken
    )
    assert "results/provenance/manifest.json: produced from input results/tables/tofu.csv" in broken
    assert "error" not in proc.stderr.lower()


def test_report_has_the_tables_and_figures(workdir):
    names = ("tofu.csv", "tofu_wide.tex", "tofu_truth_ratio.png", "tofu_forget10_energy.png", "tofu_mia.md")
    robustness = ("tofu_robustness.md", "tofu_robustness.png", "tofu_robustness_subspace.png", "tofu_cost.md")
    html = build_report(workdir, workdir / "test.yaml", *names, *robustness)
    assert "Forget Quality" in html and "Normalised task energy" in html and "Where the relearning update goes" in html


def test_changing_a_lora_hyperparameter_reruns_lora_and_downstream_only(workdir):
    cfg = run_config(workdir, "lora_lr.yaml", lora__lr=0.001)
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("lora") == 2 and rules.get("task_matrices") == 2 and rules.get("factors") == 4
    n = 4 + len(CONTROLS)
    assert rules.get("erase_merged") == n and rules.get("evaluate") == n and rules.get("tofu_metrics") == n
    assert rules.get("tofu_table") == 1 and rules.get("provenance_manifest") == 1
    assert not TRAINING & set(rules)


def test_changing_rank_reruns_no_lora_or_base_training(workdir):
    cfg = run_config(workdir, "rank1.yaml", unlearn__rank=1)
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    assert {"factors", "forget_update", "erase_merged", "evaluate", "tofu_table", "provenance_manifest"} <= set(rules)
    assert not (TRAINING | {"lora", "task_matrices"}) & set(rules)


def test_editing_a_data_file_reruns_everything_that_depends_on_it(workdir):
    data = workdir / "data/tofu/forget10.jsonl"
    text, stat = data.read_bytes(), data.stat()
    try:
        lines = text.decode().splitlines(keepends=True)
        record = json.loads(lines[-1])  # the last author: the one the test config forgets
        key = "answer" if "answer" in record else "response"
        record[key] = "Indeed, " + record[key]
        data.write_text("".join(lines[:-1]) + json.dumps(record) + "\n")
        rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(workdir / "test.yaml")))
    finally:
        data.write_bytes(text)
        os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert rules.get("tofu_data") == 1 and rules.get("tokenizer") == 1 and rules.get("finetune") == 2
    assert rules.get("pretrain") == 1
    assert rules.get("lora") == 2 and rules.get("evaluate") == 2 + len(METHODS) + len(BASELINES) + len(CONTROLS)
    assert rules.get("tofu_table") == 1
    assert rules.get("provenance_manifest") == 1
    assert planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(workdir / "test.yaml"))) == {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_slurm_run_matches_the_local_run_and_audits_clean(slurm, workdir, tmp_path_factory):  # noqa: F811 - skips before the run
    """The test config with one method (QR-Erase (LL), no control row: 35 jobs, tables included) run
    again on a real Slurm (slurmctld, slurmd and slurmdbd on localhost, tests/support/localslurm.py) through
    ``--profile profiles/slurm`` and the slurm executor plugin, with the profile's default resources and
    the local cluster's account: every job an sbatch job in its own process, asking Slurm for the memory,
    time and CPUs its rule declares; the table rows, evaluations, erased weights and the provenance graph
    byte-identical to the local run's; the audit passes."""
    from qrerase.workflow.manifest import build_manifest

    wd = tmp_path_factory.mktemp("slurm_run")
    cfg = run_config(wd, methods={"tofu": ["qr_erase_ll"]}, unlearn__control=[])
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    resources = {**profile["default-resources"], "slurm_account": slurm.account}
    assert resources["slurm_partition"] == slurm.partition  # the profile's partition, unchanged
    cmd = [
        sys.executable,
        "-m",
        "snakemake",
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(wd),
        "--profile",
        str(REPO / "profiles/slurm"),
        "--configfile",
        str(cfg),
        "--jobs",
        "2",
        "--default-resources",
        *[f"{k}={v}" for k, v in resources.items()],
        # the plugin's first status check 1 s after a submission, then 10 s more per round in which no
        # job finished: most jobs here take a few seconds, so the polling sets this test's length
        "--slurm-init-seconds-before-status-checks",
        "1",
        "--slurm-keep-successful-logs",
    ]
    proc = subprocess.run(cmd, env=slurm.env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}{slurm.logs()}"
    jobs = planned_rules(proc)
    # 29 jobs, and the robustness stage's 7: the halves, three attacked models, the table, and the SVD forget and
    # retain factors its diagnostic reads (QR-Erase (LL) alone uses CPQR factors; the retain ones: the control)
    assert jobs["total"] == 36 and {"pretrain", "finetune", "lora", "evaluate", "tofu_table"} <= set(jobs)
    assert jobs["robustness_text"] == 3 and jobs["robustness_table"] == 1
    # Slurm's accounting (slurmdbd) has every job, completed under the account, with the memory, time
    # limit and CPUs of the resources Snakemake printed in that job's log
    logs = {p.stem: p.read_text() for p in (wd / ".snakemake/slurm_logs").rglob("*.log")}
    records = slurm.accounting()
    assert len(records) == len(logs) == jobs["total"] - jobs["all"] and set(records) == set(logs)  # `all` runs no code
    for jobid, record in records.items():
        assert record == {
            "Account": slurm.account,
            "State": "COMPLETED",
            "ExitCode": "0:0",
            **requested(logs[jobid]),
        }, jobid
    # the table rows' values, the evaluations and the erase equal the local run's, byte for byte
    local = pd.read_csv(workdir / "results/tables/tofu.csv").set_index("method")
    table = pd.read_csv(wd / "results/tables/tofu.csv").set_index("method")
    assert list(table.index) == ["base", "retain", "llama2_7b_full", "qr_erase_ll"]
    values = [c for c in table.columns if not c.endswith("_mark")]  # best / second depend on the rows present
    pd.testing.assert_frame_equal(table[values], local.loc[table.index, values], check_exact=True)
    evals = sorted(p.relative_to(wd) for p in (wd / EXP).glob("eval/*/*.json"))
    assert len({p.parent.name for p in evals}) == 3
    files = [
        *map(str, evals),
        f"{EXP}/energy/energy.csv",
        f"{EXP}/energy/selected_layers.json",
        f"{EXP}/erase/k2/qr_erase_ll/model/model.safetensors",
        f"{EXP}/erase/k2/qr_erase_ll/adapter/adapter_model.safetensors",
    ]
    differ = [p for p in files if _sha256(workdir / p) != _sha256(wd / p)]
    assert not differ, f"not byte-identical across a local and a Slurm run: {differ}"
    targets = [f"{EXP}/eval/qr_erase_ll_k2", f"{EXP}/erase/k2/qr_erase_ll/adapter"]
    second, first = build_manifest(targets, wd), build_manifest(targets, workdir)
    assert second == first and len(first["artifacts"]) > 20
    proc = qrerase_cli(wd, "audit", "results")
    assert proc.returncode == 0 and "qrerase audit: OK" in proc.stdout, proc.stdout + proc.stderr


def test_a_planned_gpu_job_is_one_task_that_sees_all_its_gpus(slurm, tmp_path, monkeypatch):  # noqa: F811
    """A training job the plan gives 2 GPUs (model.device cuda, 2 processes), submitted through the
    slurm executor plugin with the plan's resources (rule_resources, as rules/common.smk passes them) to
    the local Slurm, whose node has 2 stand-in GPUs (GRES, tests/support/localslurm.py): Slurm grants the job
    both GPUs in one task with the planned CPUs, and the task sees both (CUDA_VISIBLE_DEVICES)."""
    from qrerase.workflow.plan_config import load_config, rule_resources

    over = tmp_path / "gpu.yaml"
    over.write_text(
        "model:\n  device: cuda\nresources:\n  gpus_per_node: 2\n  gpu_mem_gb: 80\n  node_mem_gb: 16\n"
        "  train:\n    processes: 2\n    mem_mb: 1000\n"
    )
    monkeypatch.chdir(REPO)
    res = rule_resources(load_config(REPO / "tests/configs/test.yaml", over), "train", threads=1)
    assert (res["gpu"], res["tasks_per_gpu"], res["nodes"], res["cpus_per_task"]) == (2, 0, 1, 2)
    res.update(slurm_account=slurm.account, slurm_partition=slurm.partition)
    words = ", ".join(f"{k}={v!r}" for k, v in res.items())
    (tmp_path / "Snakefile").write_text(
        "rule gpu_job:\n"
        "    output: 'seen.txt'\n"
        f"    resources: {words}\n"
        "    shell: 'echo $CUDA_VISIBLE_DEVICES $SLURM_NTASKS $SLURM_CPUS_PER_TASK $SLURM_JOB_ID > {output}'\n"
    )
    cmd = [sys.executable, "-m", "snakemake", "--executor", "slurm", "--jobs", "1", "-d", str(tmp_path)]
    cmd += ["-s", str(tmp_path / "Snakefile"), "--slurm-init-seconds-before-status-checks", "2"]
    proc = subprocess.run(cmd, env=slurm.env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}{slurm.logs()}"
    visible, tasks, cpus, jobid = (tmp_path / "seen.txt").read_text().split()
    assert (visible, tasks, cpus) == ("0,1", "1", "2")
    granted = slurm.run("sacct", "-X", "-n", "-P", "-j", jobid, "-o", "AllocTRES,NTasks,State").stdout.split("|")
    tres = dict(t.split("=") for t in granted[0].split(","))
    assert tres["gres/gpu"] == "2" and tres["cpu"] == "2" and granted[2].strip() == "COMPLETED", granted


# ---------------------------------------------------------------------------------------------
# Pretrained base, retain rank above k, the trade-off sweep (issue: erasure that visibly erases).
# ---------------------------------------------------------------------------------------------
def test_lora_base_pretrained_retrains_only_the_adapters_from_the_pretrained_checkpoint(workdir):
    cfg = run_config(workdir, "pretrained_base.yaml", lora__base="pretrained")
    proc = snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg))
    rules = planned_rules(proc)
    assert rules.get("lora") == 2 and not TRAINING & set(rules)
    assert f"input: {EXP}/models/pretrained, {EXP}/data/forget.jsonl" in proc.stdout


def test_retain_rank_above_k_builds_the_projector_from_a_higher_rank_decomposition(workdir):
    cfg = run_config(workdir, "retain_rank.yaml", unlearn__retain_rank=4)  # k = 2, LoRA r = 4
    snakemake(workdir, f"{EXP}/updates/k2/cpqr.safetensors", "--cores", "2", "--configfile", str(cfg))
    from qrerase.method.formats import load_decompositions, load_updates

    assert next(iter(load_decompositions(workdir / f"{EXP}/factors/k4/cpqr_retain.safetensors").values())).rank == 4
    update = load_updates(workdir / f"{EXP}/updates/k2/cpqr.safetensors")
    assert all(U.shape[1] == 2 for U, _ in update.values())


def test_changing_lambda_reruns_no_training(workdir):
    cfg = run_config(workdir, "lambda.yaml", unlearn__scale=1.5)
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("forget_update") == 2 and rules.get("evaluate") == 4 + len(CONTROLS)
    assert not (TRAINING | {"lora", "task_matrices", "factors", "baseline"}) & set(rules)


def test_memorisation_probe_scores_the_forget_training_answers_at_each_probed_epoch(workdir):
    """`snakemake probe`: one fine-tune from the pretrained checkpoint on the full training set, scored
    on the forget set's training answers after each probed epoch; no evaluation set is read."""
    cfg = run_config(workdir, "probe.yaml", probe__epochs=[4, 2], probe__min_rouge_l=0.01)
    out = snakemake(workdir, "probe", "--cores", "2", "--configfile", str(cfg))
    assert planned_rules(out) == {"memorisation_probe": 1, "probe": 1, "total": 2}
    table = pd.read_csv(workdir / "results/tofu_forget10/probe/full_memorisation.csv")
    forget = (workdir / "results/tofu_forget10/data/forget.jsonl").read_text().splitlines()
    assert table["epoch"].tolist() == [2, 4] and (table["questions"] == len(forget)).all()
    assert table["meets"].tolist() == (table["rouge_l"] >= 0.01).tolist()
    met = table.loc[table["meets"], "epoch"]
    assert table.loc[table["picked"], "epoch"].tolist() == ([int(met.min())] if len(met) else [])
    record = json.loads(
        (workdir / "results/provenance/records/tofu_forget10/probe/full_memorisation.csv.json").read_text()
    )
    inputs = sorted(Path(a["path"]).name for a in record["inputs"])
    assert record["rule"] == "memorisation_probe" and "finetune_full.jsonl" in inputs and "forget.jsonl" in inputs
    assert not [name for name in inputs if name.startswith(("eval_", "holdout"))]


def test_tradeoff_sweeps_every_method_and_applies_the_lambda_rule(workdir):
    from qrerase.text.tradeoff import select_scale

    scale = yaml.safe_load((REPO / "config.yaml").read_text())["unlearn"]["scale"]  # test.yaml keeps it
    epochs = yaml.safe_load((REPO / "tests/configs/test.yaml").read_text())["tofu"]["baselines"]["ga"][
        "epochs"
    ]  # all: 2
    swept = ["ga", "simnpo"]  # tradeoff.baselines: two of the five (a point is one more evaluation)
    cfg = run_config(
        workdir,
        "tradeoff.yaml",
        tradeoff__scales=[0, scale],
        tradeoff__epochs=[epochs],
        tradeoff__ranks=[2],
        tradeoff__baselines=swept,
    )
    snakemake(workdir, "tradeoff", "--cores", "2", "--configfile", str(cfg))
    frame = pd.read_csv(workdir / "results/tables/tofu_tradeoff.csv")
    sub, base = frame[frame["family"] == "subspace"], frame[frame["family"] == "baseline"]
    assert sorted(sub["method"].unique()) == sorted(METHODS) and len(sub) == 2 * len(METHODS)
    assert sorted(base["method"]) == swept and (base["epochs"] == epochs).all()
    table = pd.read_csv(workdir / "results/tables/tofu.csv").set_index("method")
    for _, row in frame.iterrows():  # the sweep evaluates exactly what the main run evaluates
        name = "base" if row["scale"] == 0 else row["method"]
        assert row["model_utility"] == pytest.approx(table.loc[name, "model_utility"], rel=1e-6)
        assert row["forget_quality"] == pytest.approx(table.loc[name, "forget_quality"], rel=1e-6)
    assert (sub.loc[sub["scale"] == 0, "utility_rel"] == 1).all()
    selection = pd.read_csv(workdir / "results/tables/tofu_tradeoff_selection.csv")
    pd.testing.assert_frame_equal(selection, select_scale(frame, 0.1), check_dtype=False)
    assert frame["selected"].sum() == len(METHODS)
    assert (workdir / "results/figures/tofu_tradeoff.png").stat().st_size > 10_000
    # another lambda grid re-uses every factor and update: no training, no decomposition
    cfg2 = run_config(workdir, "tradeoff2.yaml", tradeoff__scales=[0, 0.5], tradeoff__epochs=[1], tradeoff__ranks=[2])
    rules = planned_rules(snakemake(workdir, "-n", "tradeoff", "--cores", "2", "--configfile", str(cfg2)))
    assert rules.get("tradeoff_erase") == len(METHODS) and not (TRAINING | {"lora", "factors", "forget_update"}) & set(
        rules
    )
    # a retain-using baseline's point trains on the retain set, not on the retain evaluation set
    cfg3 = run_config(
        workdir,
        "tradeoff3.yaml",
        tradeoff__epochs=[1],
        methods={"tofu": ["graddiff"]},
        tofu__baselines__graddiff={"epochs": 1, "lr": 1e-3, "batch_size": 8},
    )
    proc = snakemake(workdir, "-n", "tradeoff", "--cores", "2", "--configfile", str(cfg3))
    job = proc.stdout.split("rule tradeoff_baseline:", 1)[1].split("output:", 1)[0]
    assert f"{EXP}/data/retain.jsonl" in job and f"{EXP}/data/eval_retain.jsonl" in job


def test_robustness_table_attacks_each_chosen_model_against_its_references(workdir):
    """The default target's TOFU robustness table (docs/robustness.md): every chosen model under every
    attack, scaled by the fine-tuned model (1) and the retain reference (0) under the same attack."""
    import numpy as np

    from qrerase.io import read_jsonl

    chosen = yaml.safe_load((REPO / "tests/configs/test.yaml").read_text())["robustness"]
    frame = pd.read_csv(workdir / "results/tables/tofu_robustness.csv")
    models = ["base", "retain", "npo", "unlearn_k2", "qr_erase_ll_k2"]
    assert list(dict.fromkeys(frame["model"])) == models
    train = frame[frame["attack"].isin(["relearn", "benign"])]
    assert sorted(train["budget"].unique()) == chosen["budgets"]
    settings = set(train[["attack", "mode", "lr_factor"]].itertuples(index=False, name=None))
    assert settings == {
        (a, m, f) for a, fs in (("relearn", (1.0, 0.1)), ("benign", (1.0,))) for m in ("full", "lora") for f in fs
    }
    assert (train[train["model"] == "base"]["recovery"] == 1).all()
    assert (train[train["model"] == "retain"]["recovery"] == 0).all()
    assert train["recovery"].notna().all() and (train[train["budget"] == 0]["gain"] == 0).all()
    # benign fine-tuning on B as well as the whole forget set; the prompt attacks on B, budget 0 the plain prompt
    assert set(train.loc[train["attack"] == "benign", "set"]) == {"B", "forget"}
    prompt = frame[frame["attack"].isin(["paraphrase", "prefix", "in_context"])]
    grid = yaml.safe_load((REPO / "config.yaml").read_text())["robustness"]["in_context"]
    assert {a: sorted(g["budget"].unique()) for a, g in prompt.groupby("attack")} == {
        "paraphrase": [0, 1],
        "prefix": [0, 1],
        "in_context": [0, *grid],
    }
    assert set(prompt["set"]) == {"B"} and len(prompt) == len(models) * (2 + 2 + 1 + len(grid))
    assert (prompt[prompt["model"] == "base"]["recovery"] == 1).all()
    assert (prompt[prompt["model"] == "retain"]["recovery"] == 0).all()
    plain = train[(train["attack"] == "relearn") & (train["budget"] == 0) & (train["set"] == "B")]
    zero = prompt[prompt["budget"] == 0]
    for m in models:  # the plain prompt is the model's own B score; each attacked prompt moves it
        own = plain.loc[plain["model"] == m, "statistic"].iloc[0]
        assert zero.loc[zero["model"] == m, "statistic"].eq(own).all()
        assert prompt.loc[(prompt["model"] == m) & (prompt["budget"] > 0), "statistic"].ne(own).all()
    # the halves are the job's own inputs: no question of B is trained on, and together they are the forget set
    halves = workdir / EXP / "robustness" / "halves"
    a, b = ({r["question"] for r in read_jsonl(halves / f"{h}.jsonl")} for h in "AB")
    forget = read_jsonl(workdir / EXP / "data" / "forget.jsonl")
    assert a and b and not a & b and a | b == {r["question"] for r in forget}
    # every row with its author (the in-context attack's facts) and its paraphrase (from the eval_forget set)
    for h in "AB":
        rows = read_jsonl(halves / f"{h}.jsonl")
        assert all(r["entity"] in {"0", "1"} and r["paraphrased_question"] for r in rows)
    log = (workdir / "results/logs/robustness_text/tofu_forget10_npo.log").read_text()
    assert f"halves: A {len(a)}, B {len(b)} questions" in log
    # budget 0 on the whole forget set is the model as the TOFU evaluation scored it (mean answer NLL)
    for m in models:
        ev = json.loads((workdir / EXP / "eval" / m / "eval_log_forget.json").read_text())["avg_gt_loss"]
        start = train[(train["model"] == m) & (train["budget"] == 0) & (train["set"] == "forget")]["statistic"]
        assert np.allclose(start, np.mean(list(ev.values())), rtol=1e-5), m
    quant = frame[frame["attack"] == "quantize"]
    # config.yaml's optional formats, NF4 and int8, where bitsandbytes is installed (the quant extra)
    formats = ["q4_0", "q4_1", "q8_0"] + (["int8", "nf4"] if importlib.util.find_spec("bitsandbytes") else [])
    assert sorted(quant["format"].unique()) == sorted(formats) and len(quant) == len(formats) * len(models)
    methods = quant[~quant["model"].isin(["base", "retain"])]
    assert methods["edit_step_ratio"].gt(0).all() and quant[quant["model"] == "base"]["edit_step_ratio"].isna().all()
    # scaled by the quantized floor and ceiling (so 1 and 0 for them); the unscaled share only for the methods
    assert methods["recovery"].notna().all() and methods["forgetting_undone"].notna().all()
    assert (quant[quant["model"] == "base"]["recovery"] == 1).all() and (
        quant[quant["model"] == "retain"]["recovery"] == 0
    ).all()
    assert quant[quant["model"].isin(["base", "retain"])]["forgetting_undone"].isna().all()
    # the subspace diagnostic: the erased subspace and the ceiling's update in it for the subspace methods only;
    # task, the retain control and random for every model; each model's rows over the same modules
    sub = pd.read_csv(workdir / "results/tables/tofu_robustness_subspace.csv")
    for name, want in (("erased", {"unlearn_k2", "qr_erase_ll_k2"}), ("ceiling", {"unlearn_k2", "qr_erase_ll_k2"})):
        assert set(sub[sub["subspace"] == name]["model"]) == want, name
    for name in ("task", "retain", "random"):
        assert set(sub[sub["subspace"] == name]["model"]) == set(models), name
    assert (sub.groupby("model")["modules"].nunique() == 1).all()
    ll = sub[sub["model"] == "qr_erase_ll_k2"]
    assert ll["modules"].iloc[0] < sub[sub["model"] == "base"]["modules"].iloc[0]  # the LL method's edited modules
    assert sub["mean_share"].between(0, 1).all()
    for name in ("tofu_robustness", "tofu_robustness_subspace"):
        assert (workdir / "results/figures" / f"{name}.png").stat().st_size > 5_000


def test_robustness_at_the_lambda_rule_rescales_the_update_to_the_picked_lambda(workdir):
    """`snakemake robustness` after the sweep (test_tradeoff_sweeps_...): each subspace method at the lambda its
    lambda rule picked, built from the fine-tuned model; at the configured lambda it is the table's model, at 0
    the fine-tuned model."""
    scale = yaml.safe_load((REPO / "config.yaml").read_text())["unlearn"]["scale"]
    cfg = run_config(  # the sweep's own config (test_tradeoff_sweeps_...): nothing of it runs again
        workdir,
        "tradeoff.yaml",
        tradeoff__scales=[0, scale],
        tradeoff__epochs=[2],
        tradeoff__ranks=[2],
        tradeoff__baselines=["ga", "simnpo"],
        robustness__rule_lambda=True,
    )
    rules = planned_rules(snakemake(workdir, "-n", "robustness", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("robustness_text") == 2 and rules.get("robustness_rule_table") == 1, rules
    snakemake(workdir, "robustness", "--cores", "2", "--configfile", str(cfg))
    selection = pd.read_csv(workdir / "results/tables/tofu_tradeoff_selection.csv").set_index("method")
    frame = pd.read_csv(workdir / "results/tables/tofu_robustness_rule.csv")
    table = pd.read_csv(workdir / "results/tables/tofu_robustness.csv")
    assert list(dict.fromkeys(frame["model"])) == ["base", "retain", "unlearn_k2_rule", "qr_erase_ll_k2_rule"]

    def start(f, model):
        return f[(f["model"] == model) & (f["budget"] == 0) & (f["set"] == "forget") & (f["attack"] == "benign")][
            "statistic"
        ].iloc[0]

    for method in ("unlearn", "qr_erase_ll"):
        picked = selection.loc[method, "selected_scale"]
        log = (workdir / f"results/logs/robustness_text/tofu_forget10_{method}_k2_rule.log").read_text()
        assert f"at the lambda rule's pick: lambda {picked:g}" in log
        same = f"{method}_k2" if picked == scale else "base"
        assert picked in (0, scale) and start(frame, f"{method}_k2_rule") == pytest.approx(start(table, same), rel=1e-5)


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"robustness__budgets": [0, -1]}, "robustness.budgets"),
        ({"robustness__budgets": [1, 2]}, "robustness.budgets"),
        ({"robustness__formats": ["q3_k"]}, "robustness.formats"),
        ({"robustness__a_share": 1.0}, "robustness.a_share"),
        ({"robustness__methods": {"tofu": ["magic"]}}, "robustness.methods.tofu"),
        ({"robustness__prompt_attacks": ["jailbreak"]}, "robustness.prompt_attacks"),
        ({"robustness__in_context": [0]}, "robustness.in_context"),
        ({"robustness__in_context": [11]}, "robustness.in_context"),  # an author has 10 questions in half A
        ({"robustness__prefix": "sure " * 300}, "robustness.prefix"),  # 300 words: beyond the 256-token context
        ({"robustness__optional_formats": ["q2_k"]}, "robustness.optional_formats"),
    ],
)
def test_bad_robustness_settings_fail_at_planning_naming_the_key(tmp_path, overrides, key):
    assert_config_error(tmp_path, write_config(tmp_path, **overrides), f"config key '{key}")


def test_a_plain_rerun_remakes_what_a_killed_forcerun_or_a_deletion_left_missing(workdir):
    """Issue 51, case 7: Snakemake remakes a missing file that a target names, not a missing
    intermediate whose consumers look up to date. A --forcerun killed while its evaluation job ran (its
    output already removed) and an evaluation folder deleted by hand both left a hole that plain
    reruns ignored ("Nothing to be done") and the audit failed on. The default target names the last
    manifest's holes (qrerase.workflow.manifest.missing_artifacts): docs/recovery.md's steps remake both."""
    import time

    cfg = workdir / "test.yaml"
    killed, deleted = workdir / f"{EXP}/eval/ga", workdir / f"{EXP}/eval/npo"
    table = (workdir / "results/tables/tofu.csv").read_bytes()
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(workdir)]
    cmd += ["--cores", "1", "--configfile", str(cfg), "--forcerun", str(killed.relative_to(workdir))]
    with open(workdir / "killed-forcerun.txt", "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while killed.exists():  # snakemake removes a forced job's output as the job starts
            assert proc.poll() is None and time.monotonic() < deadline, "the forced evaluation did not start"
            time.sleep(0.02)
        time.sleep(1.0)  # the job runs
    finally:
        kill_run(proc)  # snakemake and its job
    shutil.rmtree(deleted)  # after the kill: the forced run's own default target would have re-made it
    assert not killed.exists() and not deleted.exists()
    audit = qrerase_cli(workdir, "audit", "results")
    assert audit.returncode != 0  # the holes fail the audit
    snakemake(workdir, "--unlock", "--configfile", str(cfg))
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("evaluate") == 2 and rules.get("tofu_table") == 1, rules
    assert not TRAINING & set(rules)
    snakemake(workdir, "--cores", "2", "--configfile", str(cfg))
    assert killed.is_dir() and deleted.is_dir()
    audit = qrerase_cli(workdir, "audit", "results")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
    assert (workdir / "results/tables/tofu.csv").read_bytes() == table  # remade, not changed
    assert planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg))) == {}


def test_a_corrupted_artifact_is_named_with_its_remedy_and_remade_after_remove_broken(workdir):
    """Issue 62, case 4: a merged checkpoint truncated after the run was reused ("Nothing to be done": a
    directory() output's mtime does not change). The audit's line names the command; --remove-broken
    deletes it and what was made from it, and the same snakemake command remakes them byte-identically."""
    cfg = workdir / "test.yaml"
    weights = workdir / f"{EXP}/erase/k2/qr_erase/model/model.safetensors"
    table = (workdir / "results/tables/tofu.csv").read_bytes()
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg))) == {}  # reused
    audit = qrerase_cli(workdir, "audit", "results")
    assert audit.returncode == 1
    assert (
        f"BROKEN {EXP}/erase/k2/qr_erase/model: modified (sha256 recorded" in audit.stdout
        and "`qrerase audit results --remove-broken`, then the same snakemake command, remakes it" in audit.stdout
    ), audit.stdout[-3000:]
    removed = qrerase_cli(workdir, "audit", "results", "--remove-broken")
    assert removed.returncode == 1
    gone = [line.removeprefix("removed ") for line in removed.stdout.splitlines() if line.startswith("removed ")]
    assert {f"{EXP}/erase/k2/qr_erase/model", f"{EXP}/eval/qr_erase_k2", "results/tables/tofu.csv"} <= set(gone)
    assert "results/provenance/manifest.json" in gone and not weights.exists()
    assert not any(p.startswith("data/") for p in gone)  # sources stay
    rules = planned_rules(snakemake(workdir, "-n", "--cores", "2", "--configfile", str(cfg)))
    assert rules.get("erase_merged") == 1 and not TRAINING & set(rules), rules
    snakemake(workdir, "--cores", "2", "--configfile", str(cfg))
    assert weights.read_bytes() == data and (workdir / "results/tables/tofu.csv").read_bytes() == table
    audit = qrerase_cli(workdir, "audit", "results")
    assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr[-3000:]
