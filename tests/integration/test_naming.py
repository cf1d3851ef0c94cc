"""qrerase.workflow.naming (experiment names) and qrerase.registry (methods and tracks)."""

from __future__ import annotations

import re

import pytest
from support import REPO, RULES_FILES, SCRIPTS

from qrerase import registry
from qrerase.workflow.naming import (
    EXP_PATTERNS,
    Experiment,
    exp_pattern,
    format_exp,
    format_model,
    method_of,
    model_exp,
    parse_exp,
    parse_model,
)


@pytest.mark.parametrize(
    "name, track, arg",
    [
        ("tofu_forget10", "tofu", "forget10"),
        ("tofu_forget01", "tofu", "forget01"),
        ("xling", "crosslingual", None),
        ("xling_hi", "crosslingual", "hi"),
        ("xling_hi_R", "crosslingual", "hi_R"),
        ("speech", "speech", None),
        ("speech_sample", "speech", "sample"),
        ("speech_class", "speech", "class"),
        ("task_level", "task_level", None),
    ],
)
def test_round_trip(name, track, arg):
    exp = parse_exp(name)
    assert exp == Experiment(track, arg) and exp.name == name
    assert format_exp(track, arg) == name
    assert re.fullmatch(exp_pattern(), name)


def test_builders():
    assert format_exp("tofu", "forget10") == "tofu_forget10"
    assert format_exp("crosslingual", "hi_R") == "xling_hi_R" and format_exp("crosslingual", None) == "xling"
    # the cross-lingual and speech tracks build theirs with format_exp (xling_exp, speech_exp in their rules)
    assert format_exp("speech", "class") == "speech_class" and format_exp("speech", None) == "speech"


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "tofu",
        "tofu_forget1",
        "tofu_retain90",
        "xling_",
        "xling_hin",
        "xling_HI",
        "xling_hi_X",
        "speech_word",
        "speech_",
        "task_1",
        "task",
        "task_level_1",
        "tofu_forget10_extra",
        "vision",
        "xling hi",
    ],
)
def test_malformed_names_are_rejected(bad):
    with pytest.raises(ValueError, match="matches none"):
        parse_exp(bad)
    assert not re.fullmatch(exp_pattern(), bad)


@pytest.mark.parametrize(
    "track, arg", [("tofu", None), ("tofu", "forget1"), ("speech", "word"), ("task_level", "x"), ("vision", None)]
)
def test_format_rejects_what_would_not_parse_back(track, arg):
    with pytest.raises(ValueError):
        format_exp(track, arg)


def test_central_constraint_is_every_kind_in_order():
    assert exp_pattern() == (
        r"tofu_forget\d\d|xling|xling_[a-z]{2}(_R)?|speech|speech_(sample|class)|task_level|size_h\d+_s\d+"
    )
    assert exp_pattern("tofu_<split>", "xling_<lang>") == r"tofu_forget\d\d|xling_[a-z]{2}(_R)?"
    assert set(EXP_PATTERNS) == {
        "tofu_<split>",
        "xling",
        "xling_<lang>",
        "speech",
        "speech_<setting>",
        "task_level",
        "size_<shape>",
    }
    with pytest.raises(KeyError):
        exp_pattern("xling_<language>")


def test_model_experiment():
    assert model_exp("xling_hi_R") == "xling" and model_exp("xling") == "xling"
    assert model_exp("speech_sample") == "speech"
    assert model_exp("tofu_forget10") == "tofu_forget10" and model_exp("task_level") == "task_level"


# ---------------------------------------------------------------------------------------------
# The registry: the values every consumer had by hand before.
# ---------------------------------------------------------------------------------------------
#: The paper's methods per track, in table order; a method registered later (a new baseline) may follow them.
PAPER_METHODS = {
    "tofu": ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll", "ga", "graddiff", "kl", "npo", "dpo", "flat"],
    "speech": ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll", "ga", "scrub", "bad_teaching"],
    "task_level": ["unlearn", "unlearn_ll", "qr_erase", "qr_erase_ll", "ga", "kga", "ku"],
}


def test_registry_derived_values():
    assert registry.DECOMP == {"unlearn": "svd", "unlearn_ll": "svd", "qr_erase": "cpqr", "qr_erase_ll": "cpqr"}
    assert registry.methods_for("tofu") == registry.methods_for("crosslingual")
    for track, paper in PAPER_METHODS.items():
        listed = registry.methods_for(track)  # the registry's methods of the track, in registration order
        assert listed == [m.name for m in registry.METHODS if track in m.tracks]
        assert listed[: len(paper)] == paper, track  # the paper's rows first, in table order
        assert all(not registry.method(m).subspace for m in listed[len(paper) :]), track  # then baselines only
    assert {"simnpo", "rmu", "undial"} <= set(registry.methods_for("tofu")[len(PAPER_METHODS["tofu"]) :])  # issue 36
    assert [m for m in registry.DECOMP if registry.is_localised(m)] == ["unlearn_ll", "qr_erase_ll"]
    assert registry.is_localised("qr_erase_ll_control") and not registry.is_localised("unlearn_control")
    assert registry.RANK_PAIRS == (("cpqr", "qr_erase"), ("svd", "unlearn"))
    assert list(registry.TRACKS)[:4] == ["tofu", "crosslingual", "speech", "task_level"]  # the built-ins first
    with pytest.raises(KeyError):
        registry.methods_for("vision")


def test_registry_matches_the_implementations():
    from qrerase.baselines.text import TEXT_BASELINES
    from qrerase.method.decompose import DECOMPOSITIONS
    from qrerase.tracks.speech.baselines import SPEECH_BASELINES
    from qrerase.tracks.task_level.baselines import TASK_LEVEL_BASELINES

    assert registry.baselines_for("tofu") == list(TEXT_BASELINES)
    assert registry.baselines_for("crosslingual") == list(TEXT_BASELINES)
    assert registry.baselines_for("speech") == list(SPEECH_BASELINES)
    assert registry.baselines_for("task_level") == list(TASK_LEVEL_BASELINES)
    assert registry.DECOMPOSITIONS == DECOMPOSITIONS


def test_labels_are_the_paper_labels():
    from qrerase.reports.tables import METHOD_LABELS, TEX_METHOD_LABELS

    assert set(METHOD_LABELS) == set(registry.method_labels())  # every registered method has its label
    assert (
        METHOD_LABELS.items()
        >= {
            "unlearn": "UNLEARN",
            "unlearn_ll": "UNLEARN (LL)",
            "qr_erase": "QR-Erase",
            "qr_erase_ll": "QR-Erase (LL)",
            "base": "Base Model",
            "retain": "Retain reference",
            "ga": "Gradient Ascent",
            "graddiff": "Gradient Difference",
            "kl": "KL Minimization",
            "npo": "NPO",
            "dpo": "DPO",
            "flat": "FLAT",
            "simnpo": "SimNPO",
            "rmu": "RMU",
            "undial": "UNDIAL",
            "scrub": "SCRUB",
            "bad_teaching": "Bad Teaching",
            "unlearn_control": "UNLEARN, retain-adapter control",
            "unlearn_ll_control": "UNLEARN (LL), retain-adapter control",
            "qr_erase_control": "QR-Erase, retain-adapter control",
            "qr_erase_ll_control": "QR-Erase (LL), retain-adapter control",
            "kga": "KGA",
            "ku": "KU",
        }.items()
    )
    assert TEX_METHOD_LABELS == {
        "unlearn": r"\textsc{UNLEARN}",
        "unlearn_ll": r"\textsc{UNLEARN (LL)}",
        "qr_erase": r"\textsc{QR-Erase}",
        "qr_erase_ll": r"\textsc{QR-Erase} (LL)",
    }


def test_import_qrerase_registry_and_naming_stay_stdlib_only():
    import subprocess
    import sys

    code = (
        "import sys, qrerase.registry, qrerase.workflow.naming; "
        "bad = [m for m in ('torch', 'numpy', 'yaml', 'snakemake') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_method_of_an_evaluated_model():
    assert method_of("qr_erase_k4") == "qr_erase" and method_of("unlearn_ll_k12") == "unlearn_ll"
    assert method_of("ga") == "ga" and method_of("base") == "base" and method_of("bad_teaching") == "bad_teaching"
    assert method_of("qr_erase_ll_control_k2") == "qr_erase_ll_control" and method_of("x_k") == "x_k"


def test_format_and_parse_model_names():
    np = pytest.importorskip("numpy")
    assert format_model("qr_erase_ll", 4) == "qr_erase_ll_k4" and format_model("unlearn", np.int64(12)) == "unlearn_k12"
    assert parse_model("qr_erase_ll_k4") == ("qr_erase_ll", 4) and parse_model("unlearn_ll_control_k2")[1] == 2
    assert (
        parse_model("ga") == ("ga", None)
        and parse_model("x_k") == ("x_k", None)
        and parse_model("_k3") == ("_k3", None)
    )
    for method, rank in (("qr_erase", 0), ("qr_erase", True), ("qr_erase", 2.0), ("", 2)):
        with pytest.raises(ValueError, match="format_model"):
            format_model(method, rank)


def test_model_names_are_built_and_parsed_only_by_naming():
    """``<method>_k<rank>`` is built by naming.format_model and parsed by naming.parse_model /
    method_of: no f-string ``{m}_k{k}`` and no ``rpartition("_k")`` elsewhere in the code or the rules."""
    root = REPO
    files = [*root.joinpath("qrerase").rglob("*.py"), *SCRIPTS, *RULES_FILES, root / "Snakefile"]
    built = re.compile(r"\{[^{}]*\}_k\{")  # f"{m}_k{k}" (not f"forget_k{k}", an input key)
    offenders = [
        f"{f.relative_to(root)}:{i}"
        for f in files
        if f.name != "naming.py"
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if built.search(line.replace('f"{s}_k{k}"', "")) or 'rpartition("_k")' in line
    ]  # f"{s}_k{k}": the factor inputs of a set (forget / retain) at rank k, not a model name
    assert not offenders, f"model names built or parsed outside qrerase.workflow.naming: {offenders}"
