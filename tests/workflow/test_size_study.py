"""The model-size study: its library functions, its planning, and a tiny end-to-end run (two widths)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from support import REPO
from support.snakemake_cli import planned_rules, snakemake

from qrerase.method.separability import effective_layers, layer_overlap, principal_angles
from qrerase.reports.size_study import aggregate, exp_rows, read_markdown_table, render_markdown, trend
from qrerase.text.size_study import extrapolate, loglog_fit, rule_pick, scaled_lr, selectivity_at_rise, size_model
from qrerase.workflow.naming import exp_pattern, format_exp, model_exp, parse_exp, size_exp, size_of


# ---------------------------------------------------------------------------------------------
# Library
# ---------------------------------------------------------------------------------------------
def test_size_experiment_names_round_trip_and_leave_the_tofu_names_alone():
    assert size_exp(256, 1) == "size_h256_s1" and size_of("size_h256_s1") == (256, 1)
    assert parse_exp("size_h256_s1") == ("tofu", "h256_s1") and parse_exp("size_h256_s1").name == "size_h256_s1"
    assert model_exp("size_h64_s0") == "size_h64_s0"
    assert size_of(format_exp("tofu", "forget10")) is None and parse_exp("tofu_forget10") == ("tofu", "forget10")
    assert "size_h" not in exp_pattern("tofu_<split>")
    with pytest.raises(ValueError, match="width >= 1"):
        size_exp(0, 0)


def test_recipe_scales_lr_by_the_stated_law_and_widens_the_model():
    assert scaled_lr(0.002, 128, 128, 1.0) == 0.002
    assert scaled_lr(0.002, 512, 128, 1.0) == pytest.approx(0.0005)
    assert scaled_lr(0.002, 64, 128, 1.0) == pytest.approx(0.004)
    assert scaled_lr(0.002, 512, 128, 0.0) == 0.002
    model = {"name_or_path": None, "tiny": {"hidden_size": 128, "intermediate_size": 512, "num_attention_heads": 4}}
    wide = size_model(model, 256, 4)
    assert wide["tiny"]["hidden_size"] == 256 and wide["tiny"]["intermediate_size"] == 1024
    assert model["tiny"]["hidden_size"] == 128  # a copy
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        size_model(model, 66, 4)
    with pytest.raises(ValueError, match="embedded model"):
        size_model({**model, "name_or_path": "x"}, 64, 4)


def test_selectivity_is_interpolated_where_the_held_out_rise_reaches_the_target():
    x = [0, 1, 2, 4]
    retain = [2.0, 2.05, 2.15, 2.5]  # rise 0.05 at 1, 0.15 at 2: 0.1 at x* = 1.5
    forget = [3.0, 3.2, 3.6, 5.0]  # rise 0.2 at 1, 0.6 at 2: 0.4 at x* = 1.5
    out = selectivity_at_rise(x, forget, retain, target=0.1)
    assert out["x_star"] == pytest.approx(1.5) and out["forget_rise"] == pytest.approx(0.4)
    assert out["selectivity"] == pytest.approx(4.0)
    shuffled = selectivity_at_rise(x[::-1], forget[::-1], retain[::-1], target=0.1)
    assert shuffled == pytest.approx(out)
    never = selectivity_at_rise([0, 1], [3.0, 4.0], [2.0, 2.05], target=0.1)
    assert math.isnan(never["selectivity"]) and math.isnan(never["x_star"])
    with pytest.raises(ValueError, match="x = 0 point"):
        selectivity_at_rise([1, 2], [1, 2], [1, 2])


def test_rule_pick_is_the_largest_point_within_the_rise():
    assert rule_pick([0, 1, 2, 4], [2.0, 2.05, 2.15, 2.5], 0.1) == 1.0
    assert rule_pick([0, 1], [2.0, 3.0], 0.1) == 0.0
    assert rule_pick([0, 1, 2, 8], [2.0, 2.05, 2.15, -np.inf], 0.1) == 1.0  # a degenerate point is never picked
    assert rule_pick([0, 1, 2, 8], [2.0, 2.05, 2.15, np.nan], 0.1) == 1.0
    with pytest.raises(ValueError, match="max_rise"):
        rule_pick([0, 1], [2.0, 3.0], -1)


def test_loglog_fit_recovers_a_power_law_and_refuses_fewer_than_three_widths():
    n = np.array([1e5, 1e5, 4e5, 4e5, 1.6e6, 1.6e6, 6.4e6])
    rng = np.random.default_rng(0)
    sel = 0.01 * n**0.5 * np.exp(rng.normal(0, 0.05, n.size))
    fit = loglog_fit(n, sel)
    assert fit["slope"] == pytest.approx(0.5, abs=0.05) and 0 < fit["slope_se"] < 0.05
    centre, lo, hi = extrapolate(fit, 8e9)
    assert lo < centre < hi and centre == pytest.approx(0.01 * 8e9**0.5, rel=0.5)
    exact = loglog_fit([1e3, 1e4, 1e5], [1.0, 10.0, 100.0])
    assert exact["slope"] == pytest.approx(1.0) and exact["intercept"] == pytest.approx(-3.0)
    assert loglog_fit([1e3, 1e3, 1e4], [1.0, 2.0, 3.0]) is None
    assert loglog_fit([1e3, 1e4, 1e5, 1e6], [1.0, -1.0, 100.0, 1000.0])["dropped"] == 1
    assert loglog_fit([1e3, 1e4, 1e5, 1e6], [1.0, float("nan"), 100.0, 1000.0])["dropped"] == 1


def test_principal_angles_of_known_subspaces():
    e = np.eye(4)
    assert principal_angles(e[:, :2], e[:, :2]) == pytest.approx([0, 0], abs=1e-7)
    assert principal_angles(e[:, :2], e[:, 2:]) == pytest.approx([math.pi / 2] * 2)
    tilted = np.stack([(e[:, 0] + e[:, 2]) / math.sqrt(2), e[:, 1]], axis=1)
    assert principal_angles(e[:, :2], tilted) == pytest.approx([0, math.pi / 4], abs=1e-7)
    with pytest.raises(ValueError, match="expected"):
        principal_angles(e[:3, :2], e[:, :2])


def test_layer_overlap_per_block_and_effective_layers():
    e = np.eye(8)
    dec = lambda Q: SimpleNamespace(Q=Q)  # noqa: E731
    forget = {"model.layers.0.mlp.up_proj": dec(e[:, :2]), "model.layers.1.mlp.up_proj": dec(e[:, :2])}
    retain = {"model.layers.0.mlp.up_proj": dec(e[:, :2]), "model.layers.1.mlp.up_proj": dec(e[:, 2:4])}
    rows = layer_overlap(forget, retain)
    assert [r["layer"] for r in rows] == [0, 1]
    assert rows[0]["overlap"] == pytest.approx(1.0) and rows[1]["overlap"] == pytest.approx(0.0, abs=1e-12)
    assert rows[0]["random"] == pytest.approx(2 / 8) and rows[1]["min_angle_deg"] == pytest.approx(90)
    assert effective_layers({"0": 1, "1": 1, "2": 1}) == pytest.approx(3)
    assert effective_layers([5.0, 0.0, 0.0]) == pytest.approx(1)
    p = np.array([0.5, 0.25, 0.25])
    assert effective_layers(p) == pytest.approx(math.exp(-(p * np.log(p)).sum()))
    with pytest.raises(ValueError, match="non-negative"):
        effective_layers([1.0, -1.0])


def _points(forget_slope: float, baseline_forget: float) -> pd.DataFrame:
    rows = []
    for method in ("unlearn", "qr_erase"):
        for lam in (0, 1, 2, 4):
            rows.append(
                dict(method=method, family="subspace", scale=lam, epochs=np.nan, forget_nll=3 + forget_slope * lam,
                     tune_retain_nll=2 + 0.08 * lam, forget_quality=1e-4 * (1 + lam), model_utility=0.5 - 0.01 * lam)
            )  # fmt: skip
    for ep in (1, 2):
        rows.append(
            dict(method="graddiff", family="baseline", scale=np.nan, epochs=ep, forget_nll=3 + baseline_forget * ep,
                 tune_retain_nll=2 + 0.06 * ep, forget_quality=1e-3 * ep, model_utility=0.45)
        )  # fmt: skip
    return pd.DataFrame(rows)


def test_rows_aggregate_and_trend_of_a_synthetic_study():
    frames = []
    for width, params, slope in ((16, 1e4, 0.2), (32, 4e4, 0.4), (64, 1.6e5, 0.8)):
        for seed in (0, 1):
            rows = exp_rows(_points(slope + 0.01 * seed, 1.0), width=width, seed=seed, n_params=int(params),
                            target=0.1, max_rise=0.1)  # fmt: skip
            frames.append(rows.assign(overlap=0.5, overlap_random=0.1, min_angle_deg=10.0, effective_layers=1.5))
    per_seed = pd.concat(frames, ignore_index=True)
    un = per_seed[(per_seed["method"] == "unlearn") & (per_seed["width"] == 16) & (per_seed["seed"] == 0)].iloc[0]
    assert un["x_star"] == pytest.approx(1.25) and un["selectivity"] == pytest.approx(2.5) and un["picked"] == 1.0
    assert un["forget_quality"] == pytest.approx(2e-4) and un["utility_rel"] == pytest.approx(0.49 / 0.5)
    gd = per_seed[(per_seed["method"] == "graddiff") & (per_seed["width"] == 16)].iloc[0]
    assert gd["x_star"] == pytest.approx(5 / 3) and gd["selectivity"] == pytest.approx(50 / 3) and gd["picked"] == 1.0
    agg = aggregate(per_seed)
    assert len(agg) == 9 and set(agg["seeds"]) == {2}
    cell = agg[(agg["method"] == "unlearn") & (agg["width"] == 32)].iloc[0]
    assert cell["selectivity"] == pytest.approx(5.0625) and cell["selectivity_sd"] == pytest.approx(
        0.125 / math.sqrt(2)
    )
    fits = trend(per_seed).set_index("method")
    assert fits.loc["unlearn", "slope"] == pytest.approx(0.5, abs=0.01)
    assert fits.loc["graddiff", "slope"] == pytest.approx(0.0, abs=1e-9)
    assert fits.loc["unlearn", "at_8B"] > fits.loc["unlearn", "at_7B"]
    md = render_markdown(agg, trend(per_seed), 0.1, 0.1)
    assert "extrapolation" in md and md.count("\n| ") >= 9 + 3
    two = trend(per_seed[per_seed["width"] < 64])
    assert (two["note"].str.startswith("no fit")).all()
    assert "no fit" in render_markdown(aggregate(per_seed[per_seed["width"] < 64]), two, 0.1, 0.1)
    # a published table reads back (as quoted in a docs page) to the values it was rendered from
    back = read_markdown_table("Some page.\n\n" + md + "\nMore text.\n")
    assert list(back["method"]) == list(agg["method"]) and list(back["params"]) == list(agg["params"])
    assert back["selectivity"].to_numpy() == pytest.approx(agg["selectivity"].round(2).to_numpy())
    assert back["selectivity_sd"].to_numpy() == pytest.approx(agg["selectivity_sd"].round(2).to_numpy())
    assert back["forget_quality"].to_numpy() == pytest.approx(agg["forget_quality"].to_numpy(), rel=5e-3)
    assert list(back["reached"]) == list(agg["reached"])
    with pytest.raises(ValueError, match="no size-study table"):
        read_markdown_table("| Other | Table |\n|---|---|\n| a | b |\n")


def test_attack_aucs_per_width_are_recorded_and_averaged():
    from qrerase.reports.size_study import PRIVACY, privacy_row

    frames = []
    for width, params, base_min_k, base_pp in ((16, 1e4, 0.9, 0.95), (32, 4e4, 0.7, 0.8)):
        for seed in (0, 1):
            sequence = {
                "base": {"mia_min_k": base_min_k, "mia_min_k_plus_plus": base_pp + 0.02 * seed},
                "retain": {"mia_min_k": 0.2, "mia_min_k_plus_plus": 0.3},
            }
            rows = exp_rows(_points(0.2, 1.0), width=width, seed=seed, n_params=int(params), target=0.1, max_rise=0.1)
            mech = dict(overlap=0.5, overlap_random=0.1, min_angle_deg=10.0, effective_layers=1.5)
            frames.append(rows.assign(**mech, **privacy_row(sequence)))
    per_seed = pd.concat(frames, ignore_index=True)
    row = per_seed[(per_seed["width"] == 16) & (per_seed["seed"] == 0)].iloc[0]
    # PrivLeak = (r - a) / (1 - r) * 100 of the Min-K% AUCs: (0.2 - 0.9) / 0.8 * 100
    assert row["base_privleak"] == pytest.approx(-87.5) and row["base_mia_min_k_plus_plus"] == 0.95
    assert row["retain_mia_min_k_plus_plus"] == 0.3
    agg = aggregate(per_seed)
    cell = agg[(agg["method"] == "unlearn") & (agg["width"] == 32)].iloc[0]
    assert cell["base_mia_min_k_plus_plus"] == pytest.approx(0.81)
    assert cell["base_mia_min_k_plus_plus_sd"] == pytest.approx(0.02 / math.sqrt(2))
    assert cell["base_privleak"] == pytest.approx((0.2 - 0.7) / 0.8 * 100)
    md = render_markdown(agg, trend(per_seed), 0.1, 0.1)
    assert "Min-K%++ AUC fine-tuned (retain) | PrivLeak fine-tuned |" in md
    assert "| 0.810 ± 0.014 (0.300) | -62.5 ± 0.0 |" in md  # two seeds, same Min-K% AUC
    back = read_markdown_table(md)  # the extra columns do not disturb reading the table back
    assert list(back["width"]) == list(agg["width"])
    assert set(PRIVACY) <= set(agg.columns)
    with pytest.raises(ValueError, match=r"no sequence metrics of \['retain'\]"):
        privacy_row({"base": {"mia_min_k": 0.5, "mia_min_k_plus_plus": 0.5}})


def test_size_study_figure_draws_a_model_outside_the_ladder(tmp_path):
    """`qrerase size-study-figure`: the ladder's lines from a published table plus one real model's stars."""
    from qrerase.cli import main

    sel = tmp_path / "tofu_selectivity.csv"
    pd.DataFrame({"group": ["tofu"] * 2, "method": ["qr_erase", "npo"], "selectivity": [5.0, float("nan")]}).to_csv(
        sel, index=False
    )
    out = tmp_path / "fig.png"
    table = str(REPO / "docs" / "size-study.md")
    assert (
        main(["size-study-figure", "--table", table, "--point", "a real LM", "134515008", str(sel), "--out", str(out)])
        == 0
    )
    assert out.stat().st_size > 20_000


# ---------------------------------------------------------------------------------------------
# Workflow: planning and a tiny end-to-end run
# ---------------------------------------------------------------------------------------------
def size_config(workdir: Path, **size) -> Path:
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test_size.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg["size_study"].update(size)
    path = workdir / "size.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_size_study_plans_every_width_and_seed_and_stays_out_of_the_default_run(tmp_path):
    cfg = size_config(tmp_path, widths=[16, 32, 64], seeds=[0, 1])
    text = snakemake(tmp_path, "-n", "-p", "--cores", "1", "--configfile", str(cfg), "--", "size_study").stdout
    for w in (16, 32, 64):
        for s in (0, 1):
            assert f"results/size_h{w}_s{s}/size_study/rows.csv" in text
    # the recipe reaches the jobs: width, 4x intermediate, lr x 32 / W (pretrain lr 0.003), the seed
    pretrain = next(line for line in text.splitlines() if "logs/pretrain/size_h16_s1.log" in line and "--job" in line)
    assert '"hidden_size":16' in pretrain and '"intermediate_size":64' in pretrain
    assert '"lr":0.006' in pretrain and '"seed":1' in pretrain
    assert "results/tofu_forget10/" not in text
    default = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg)).stdout
    assert "size_h" not in default and "results/tofu_forget10/" in default
    assert not (tmp_path / "results").exists()


def test_the_plan_counts_in_the_docs_are_the_default_configs_plan(tmp_path):
    """docs/size-study.md quotes what `snakemake size_study -n` plans on the default config, and without
    `wide_seeds`; this plans both and compares."""
    doc = " ".join((REPO / "docs" / "size-study.md").read_text(encoding="utf-8").split())
    m = re.search(r"# plan: (\d+) jobs \((\d+) per width and seed; (\d+) experiments\)", doc)
    assert m, "docs/size-study.md: the `snakemake size_study -n` line lost its plan comment"
    total, per_exp, n_exp = map(int, m.groups())
    (tmp_path / "data").symlink_to(REPO / "data")  # the default config's relative data roots
    plan = planned_rules(snakemake(tmp_path, "-n", "--cores", "1", "--", "size_study"))
    assert plan.pop("total") == total
    shared = {"size_study_table", "size_study"}  # one job each, over every experiment
    assert sum(plan.values()) == total and plan["size_study_exp"] == n_exp
    assert all(n % n_exp == 0 for rule, n in plan.items() if rule not in shared)
    assert sum(n for rule, n in plan.items() if rule not in shared) == per_exp * n_exp
    # without wide_seeds: a min_width above every width runs every width with every seed
    path = tmp_path / "all_seeds.yaml"
    path.write_text(yaml.safe_dump({"size_study": {"wide_seeds": {"min_width": 1 << 20, "seeds": [0]}}}))
    plan = planned_rules(snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(path), "--", "size_study"))
    assert f"Remove `wide_seeds` to run every width with every seed ({plan['total']} jobs)" in doc
    assert not (tmp_path / "results").exists()


def test_wide_seeds_limit_the_seeds_of_the_wide_widths(tmp_path):
    wide = {"min_width": 32, "seeds": [1]}
    cfg = size_config(tmp_path, widths=[16, 32, 64], seeds=[0, 1], wide_seeds=wide)
    text = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--", "size_study").stdout
    planned = {e for w in (16, 32, 64) for s in (0, 1) if f"results/size_h{w}_s{s}/size_study/rows.csv" in text
               for e in [(w, s)]}  # fmt: skip
    assert planned == {(16, 0), (16, 1), (32, 1), (64, 1)}
    cfg = size_config(tmp_path, seeds=[0, 1], wide_seeds={"min_width": 32, "seeds": [2]})
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--", "size_study", check=False)
    assert proc.returncode != 0 and "size_study.wide_seeds.seeds: [2] must be a subset" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


def test_size_study_rejects_a_width_the_heads_do_not_divide(tmp_path):
    cfg = size_config(tmp_path, widths=[16, 18])
    proc = snakemake(tmp_path, "-n", "--cores", "1", "--configfile", str(cfg), "--", "size_study", check=False)
    assert proc.returncode != 0 and "size_study.widths: 18" in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists()


@pytest.mark.workflow
def test_size_study_end_to_end_on_two_tiny_widths(tmp_path):
    cfg = size_config(tmp_path)
    snakemake(tmp_path, "--cores", "2", "--configfile", str(cfg), "--", "size_study")
    tables = tmp_path / "results" / "tables"
    agg = pd.read_csv(tables / "size_study.csv")
    assert sorted(agg["width"].unique()) == [16, 32] and set(agg["method"]) == {"qr_erase", "graddiff"}
    assert (agg["params"][agg["width"] == 32] > agg["params"][agg["width"] == 16].max()).all()
    assert agg["forget_quality"].between(0, 1).all() and agg["model_utility"].between(0, 1).all()
    assert agg["overlap"].between(0, 1).all() and agg["effective_layers"].between(1, 2).all()
    points = pd.read_csv(tables / "size_study_points.csv")
    assert len(points) == 4 and set(points["seed"]) == {0}
    # the pick is a grid point within the rule, read from the experiment's own sweep
    assert set(points.loc[points["family"] == "subspace", "picked"]) <= {0, 8, 32}
    assert (pd.read_csv(tables / "size_study_trend.csv")["note"].str.startswith("no fit")).all()
    assert "no fit" in (tables / "size_study.md").read_text()
    assert (tmp_path / "results" / "figures" / "size_study.png").stat().st_size > 10_000
    layers = pd.read_csv(tmp_path / "results" / "size_h32_s0" / "size_study" / "layers.csv")
    assert list(layers["layer"]) == [0, 1] and layers["random"].between(2 / 128, 2 / 16).all()
