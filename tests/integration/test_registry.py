"""qrerase.registry: methods registered once with their implementation; dispatch, schema and plan derived from it.

In-process registrations run on a copy of the registry (restored after each test). The plug-in test
runs the real snakemake CLI (dry run) with the toy plug-in of tests/plugins on the small test config.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from support import PLUGINS, REPO

from qrerase import registry
from qrerase.registry import RegistryError, register_method


@pytest.fixture
def scratch_registry(monkeypatch):
    """The registry as loaded, restored after the test (a registration here leaks into no other test)."""
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    return registry


# ---------------------------------------------------------------------------------------------
# Registration: one name, one record; bad registrations say what is wrong.
# ---------------------------------------------------------------------------------------------
def test_duplicate_registration_is_rejected(scratch_registry):
    with pytest.raises(RegistryError, match="method 'ga' is already registered"):
        register_method("ga", label="Again", tracks=("tofu",), run={"text": "x:Y"})
    before = registry.methods_for("tofu")
    register_method("toy", label="Toy", tracks=("tofu",), run={"text": "x:Y"})
    with pytest.raises(RegistryError, match="method 'toy' is already registered"):
        register_method("toy", label="Toy 2", tracks=("tofu",), run={"text": "x:Y"})
    assert registry.methods_for("tofu") == [*before, "toy"] and registry.method("toy").label == "Toy"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"tracks": ("vision",)}, "tracks must be among"),
        ({"run": {"speech": "x:y"}}, r"no implementation for the \['text'\] runner"),
        ({"run": {"text": "x:Y", "vision": "x:y"}}, "unknown runner"),
        ({"settings": {"tofu.baselines": {}}}, r"section\(s\) \['tofu.baselines'\] are generated from its hparams"),
        ({"settings": {"bogus": {}}}, "unknown settings section"),
        ({"hparams": dict}, "is not a dataclass derived from qrerase.hparams.Hparams"),
        ({"hparams": {"speech": "x:Y"}}, r"hparams for runner\(s\) \['speech'\]"),
        ({"inputs": ("weights",)}, "unknown input"),
        ({"decomp": "cpqr"}, "only the built-in subspace methods have a decomposition"),
    ],
)
def test_bad_registrations_are_rejected(scratch_registry, kwargs, message):
    args = {"label": "Toy", "tracks": ("tofu",), "run": {"text": "x:Y"}, **kwargs}
    with pytest.raises(RegistryError, match=message):
        register_method("toy", **args)
    assert "toy" not in registry.methods_for("tofu")


@pytest.mark.parametrize("name", ["base", "qr_erase_control", "not a name"])
def test_reserved_and_malformed_names_are_rejected(scratch_registry, name):
    with pytest.raises(RegistryError, match="expected an identifier"):
        register_method(name, label="X", tracks=("tofu",), run={"text": "x:Y"})


# ---------------------------------------------------------------------------------------------
# Dispatch: every runner looks its implementation up; an unknown name is an error, no fall-through.
# ---------------------------------------------------------------------------------------------
def test_unknown_names_are_errors_not_defaults():
    from qrerase.baselines.text import TextBaselineConfig
    from qrerase.tracks.speech.baselines import SpeechBaselineConfig, run_baseline
    from qrerase.tracks.task_level.runners import TaskLevelBaselineJob, run_task_level_baseline

    with pytest.raises(RegistryError, match="unknown method 'nope'"):
        registry.method("nope")
    with pytest.raises(KeyError):  # a RegistryError is a KeyError too (dict-like lookups)
        registry.method("nope")
    with pytest.raises(RegistryError, match="method 'npo' has no 'speech' implementation"):
        registry.implementation("npo", "speech")
    with pytest.raises(ValueError, match="unknown method 'nope'; expected one of"):
        TextBaselineConfig(method="nope")
    speech = registry.baselines_of_runner("speech")  # the registered speech baselines (no kl among them)
    with pytest.raises(ValueError, match=re.escape(f"speech baseline must be one of {speech}")):
        run_baseline(
            "kl", None, {}, np.zeros(1, bool), np.zeros(1, bool), SpeechBaselineConfig.from_dict({"method": "ga"})
        )
    job = TaskLevelBaselineJob("npo", None, None, [], [], [], None, {}, lambda: None, "task-npo")
    task = registry.baselines_of_runner("task_level")
    with pytest.raises(ValueError, match=re.escape(f"task-level baseline must be one of {task}, got 'npo'")):
        run_task_level_baseline(job)


def test_every_builtin_implementation_resolves_to_its_runner():
    from qrerase.baselines import rmu, simnpo, standard, undial
    from qrerase.method.discriminate import forget_updates
    from qrerase.tracks.speech import baselines as speech
    from qrerase.tracks.task_level import runners as task_level_runners

    expected = {
        ("ga", "text"): standard.GradientAscent,
        ("graddiff", "text"): standard.GradientDifference,
        ("kl", "text"): standard.KLMinimization,
        ("npo", "text"): standard.NPO,
        ("dpo", "text"): standard.DPO,
        ("flat", "text"): standard.FLAT,
        ("simnpo", "text"): simnpo.SimNPO,
        ("rmu", "text"): rmu.RMU,
        ("undial", "text"): undial.UNDIAL,
        ("ga", "task_level"): task_level_runners.run_text_objective,
        ("kga", "task_level"): task_level_runners.run_kga,
        ("ku", "task_level"): task_level_runners.run_ku,
        ("ga", "speech"): speech.run_ga,
        ("scrub", "speech"): speech.run_scrub,
        ("bad_teaching", "speech"): speech.run_bad_teaching,
    }
    for (name, kind), impl in expected.items():
        assert registry.implementation(name, kind) is impl
    for name in registry.SUBSPACE_METHODS:
        assert registry.implementation(name, "text") is forget_updates
    registered = {(m.name, k) for m in registry.METHODS if m.decomp is None for k in m.run}
    assert set(expected) <= registered  # the built-in baselines; a newer one resolves too
    for name, kind in registered - set(expected):
        assert callable(registry.implementation(name, kind)), (name, kind)
    # what the plan and the input functions read
    assert [m for m in registry.METHODS if "refusals" in m.inputs] == [registry.method("dpo"), registry.method("flat")]
    assert [m.name for m in registry.METHODS if "initial" in m.inputs] == ["kga"]


def test_a_registered_text_baseline_is_what_train_baseline_runs(scratch_registry, monkeypatch, tmp_path):
    """The toy objective (half a GA step) registered by name: train_baseline dispatches to it, so its first
    loss is half of Gradient Ascent's from the same model (the loss of step 1 precedes any update)."""
    from support.tiny_text import TINY, TPL, tofu_qa

    from qrerase.baselines.text import TextBaselineConfig, train_baseline
    from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer

    monkeypatch.syspath_prepend(str(PLUGINS))
    register_method("toy_half", label="Toy", run={"text": "toy_plugin:HalfAscent"})
    forget = tofu_qa(0, 8)
    tok = train_bpe_tokenizer([f"{r['question']} {r['answer']}" for r in forget], 300, tmp_path / "tok")
    model = build_tiny_llama(TINY, tok, seed=0)
    curves = {}
    for method in ("ga", "toy_half"):
        cfg = TextBaselineConfig.from_dict({"method": method, "epochs": 1, "lr": 1e-3, "batch_size": 4, "threads": 1})
        _, curves[method] = train_baseline(copy.deepcopy(model), None, tok, forget, [], TPL, cfg)
    assert curves["toy_half"][0]["loss"] == pytest.approx(0.5 * curves["ga"][0]["loss"], rel=1e-6)
    assert curves["toy_half"][0]["forget_nll"] == pytest.approx(curves["ga"][0]["forget_nll"], rel=1e-6)


# ---------------------------------------------------------------------------------------------
# Derived: the schema (enums and per-method sections), the config checks, the plug-in loading.
# ---------------------------------------------------------------------------------------------
def test_schema_sections_come_from_the_registrations(scratch_registry):
    from qrerase.workflow.validation import load_schema

    def sections(schema):
        props = schema["properties"]
        return (
            list(props["tofu"]["properties"]["baselines"]["properties"]),
            list(props["task_level"]["properties"]["baselines"]["properties"]),
            list(props["speech"]["properties"]["baselines"]["properties"]),
            list(props["speech"]["properties"]["tradeoff"]["properties"]["baselines"]["properties"]),
            props["methods"]["properties"]["tofu"]["items"]["enum"],
        )

    text, task, speech, sweep, tofu = sections(load_schema())
    assert text == ["mode", "lora", "max_length", "refusals", *registry.baselines_of_runner("text")]
    assert task == registry.baselines_of_runner("task_level")
    assert speech == ["common", *registry.baselines_of_runner("speech")]
    assert sweep == registry.baselines_of_runner("speech") and tofu == registry.methods_for("tofu")
    register_method("toy", label="Toy", tracks=("tofu",), run={"text": "x:Y"}, description="toy")
    text2, task2, _, _, tofu2 = sections(load_schema())
    assert text2 == [*text, "toy"] and task2 == task and tofu2 == [*tofu, "toy"]
    assert load_schema()["properties"]["tofu"]["properties"]["baselines"]["properties"]["toy"]["description"] == "toy"


def _test_config(**changes) -> dict:
    """config.yaml updated by tests/configs/test.yaml as Snakemake merges them, then ``changes`` (top-level keys)."""
    from qrerase.workflow.plan_config import deep_update

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    deep_update(cfg, yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text()))
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    for key, value in changes.items():
        cfg[key] = value
    return cfg


def test_config_plugins_register_their_methods_and_bad_ones_name_the_key(scratch_registry, monkeypatch):
    from qrerase.workflow.validation import ConfigError, validate

    cfg = _test_config(methods={"tofu": ["qr_erase", "toy_ga"]})
    with pytest.raises(ConfigError, match="config key 'methods.tofu.1'"):
        validate(cfg)  # toy_ga is not registered without its plug-in
    with pytest.raises(ConfigError, match="config key 'plugins.0': plugin 'no_such_plugin': cannot be imported"):
        validate({**cfg, "plugins": ["no_such_plugin"]})
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "toy_plugin", raising=False)
    with pytest.raises(ConfigError, match="baseline 'toy_ga' has no 'tofu.baselines.toy_ga' settings"):
        validate({**cfg, "plugins": ["toy_plugin"]})
    bl = cfg["tofu"]["baselines"]
    bad = {
        **cfg,
        "plugins": ["toy_plugin"],
        "tofu": {**cfg["tofu"], "baselines": {**bl, "toy_ga": {"epochs": 1, "beta": 1}}},
    }
    with pytest.raises(ConfigError, match="config key 'tofu.baselines.toy_ga.beta': unknown key"):
        validate(bad)  # its generated section: no beta (toy_ga has no hyperparameter), and it needs lr, batch_size
    good = {**cfg, "plugins": ["toy_plugin"]}
    good["tofu"] = {**cfg["tofu"], "baselines": {**bl, "toy_ga": {"epochs": 1, "lr": 1e-3, "batch_size": 4}}}
    validate(good)
    assert registry.method("toy_ga").label == "Toy Half Ascent"
    monkeypatch.delitem(sys.modules, "toy_plugin")


def test_a_launched_job_imports_the_plugins_of_its_spec(scratch_registry, monkeypatch):
    from qrerase.workflow.launch import NamedList, job_spec, load_job

    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "toy_plugin", raising=False)
    nothing = {"input": NamedList(), "output": NamedList(), "wildcards": NamedList(), "params": {}}
    plain = json.loads(job_spec("baseline", **nothing, config={"seed": 0}))
    assert "plugins" not in plain  # a config without plug-ins: the job spec is as before
    spec = job_spec("baseline", **nothing, config={"plugins": ["toy_plugin"]})
    assert json.loads(spec)["plugins"] == ["toy_plugin"]
    with pytest.raises(RegistryError):
        registry.method("toy_ga")
    load_job(["--threads", "1", "--job", spec])
    assert registry.implementation("toy_ga", "text").__name__ == "HalfAscent"
    monkeypatch.delitem(sys.modules, "toy_plugin")


def test_a_baseline_module_registers_at_import_without_torch():
    """A text baseline is one module (its hyperparameters, objective and registration) that planning imports:
    importing the toy plug-in or a built-in one registers the methods and loads neither torch nor numpy, and
    the registered implementation is the module's own class."""
    code = (
        "import sys, toy_plugin, qrerase.baselines.simnpo as s; from qrerase import registry as r; "
        "assert r.implementation('toy_scaled', 'text') is toy_plugin.ScaledAscent; "
        "assert r.hparams_of('toy_scaled', 'text') is toy_plugin.ToyScale; "
        "assert r.method('toy_scaled').tracks == ('tofu',); "
        "assert r.implementation('simnpo', 'text') is s.SimNPO and r.hparams_of('simnpo', 'text') is s.SimNpoHparams; "
        "bad = [m for m in ('torch', 'numpy') if m in sys.modules]; assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), str(REPO)])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize(
    "first",
    [
        "qrerase.baseline_config",
        "qrerase.baselines",
        "qrerase.baselines.settings",
        "qrerase.baselines.standard",
        "qrerase.baselines.undial",
        "qrerase.tracks.task_level.settings",
        "qrerase.workflow.validation",
    ],
)
def test_the_registry_is_the_same_whichever_planning_module_is_imported_first(first):
    """A method module registers at import and imports the registry, which imports the method modules: whichever
    of them a process imports first, the registry loads in full and in table order (no circular-import error)."""
    code = (
        f"import importlib; importlib.import_module({first!r}); from qrerase import registry as r; "
        "print(*(f'{m.name}:{\",\".join(m.tracks)}' for m in r.METHODS))"
    )
    got = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    assert got == [f"{m.name}:{','.join(m.tracks)}" for m in registry.METHODS]


def test_a_registration_without_tracks_serves_the_track_that_brings_its_runner(scratch_registry):
    assert register_method("toy_default", label="Toy", run={"text": "toy_plugin:HalfAscent"}).tracks == ("tofu",)
    with pytest.raises(RegistryError, match=r"^method 'toy_bare': give its tracks, or run=\{runner: implementation\}"):
        register_method("toy_bare", label="Toy", run="toy_plugin:HalfAscent")


# ---------------------------------------------------------------------------------------------
# The workflow plans a plug-in's method: its baseline job and its table row, through snakemake -n.
# ---------------------------------------------------------------------------------------------
def test_snakemake_plans_a_plugin_baseline(tmp_path):
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg["plugins"] = ["toy_plugin"]
    cfg["methods"]["tofu"] = [*cfg["methods"]["tofu"], "toy_ga"]
    cfg["tofu"]["baselines"]["toy_ga"] = {"epochs": 1, "lr": 1.0e-3, "batch_size": 8}
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory", str(tmp_path)]
    cmd += ["-n", "--cores", "1", "--configfile", str(tmp_path / "test.yaml")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-4000:]
    exp = f"tofu_{cfg['tofu']['data']['split']}"
    jobs = [block for block in text.split("\nrule ")[1:]]
    toy_baseline = [b for b in jobs if b.startswith("baseline:") and "method=toy_ga" in b]
    assert len(toy_baseline) == 1 and f"results/{exp}/baselines/toy_ga_loss.csv" in toy_baseline[0]
    toy_eval = [b for b in jobs if b.startswith("evaluate:") and "model=toy_ga" in b]
    assert len(toy_eval) == 1 and f"results/{exp}/baselines/toy_ga/model" in toy_eval[0]
    table = [b for b in jobs if b.startswith("tofu_table:")]
    assert len(table) == 1 and f"results/{exp}/metrics/toy_ga.csv" in table[0]
    # without the plug-in the same config is refused at planning time, naming the first bad key
    cfg["plugins"] = []
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "config key 'methods.tofu.9': 'toy_ga' is not one of" in text
    assert not (tmp_path / "results").exists()


def test_task_level_jobs_load_sharded_where_their_runner_allows_it(monkeypatch):
    """rule task_level_baseline loads with rank 0 alone reading the weights (FSDP2 over several processes)
    for GA and KGA; KU evaluates the fine-tuned model before training, so every rank loads it; a runner that
    declares nothing loads whole. One process: never sharded."""
    from qrerase.tracks.task_level.runners import loads_sharded

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert [loads_sharded(m, "fsdp") for m in ("ga", "kga", "ku")] == [True, True, False]
    assert not loads_sharded("ga", "ddp")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not loads_sharded("kga", "fsdp")
