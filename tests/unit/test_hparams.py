"""qrerase.hparams: training keys declared once, each method's own hyperparameters, and a plug-in's.

The toy plug-in (tests/plugins/toy_plugin.py) registers ``toy_scaled``, a text baseline with its own
hyperparameter ``toy_scale`` (a float > 0): its validation, its generated schema section and config
page row, and its value in the objective (the plug-in's ``ScaledAscent``).
"""

from __future__ import annotations

import importlib
import sys

import pytest
import yaml
from support import PLUGINS, REPO

from qrerase import registry
from qrerase.baselines.settings import TextBaselineConfig
from qrerase.hparams import TrainConfig, key_schema
from qrerase.tracks.speech.settings import SpeechBaselineConfig
from qrerase.tracks.task_level.settings import TaskLevelBaselineConfig


@pytest.fixture
def toy(monkeypatch):
    """The registry with the toy plug-in's methods, restored after the test."""
    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.delitem(sys.modules, "toy_plugin", raising=False)
    importlib.import_module("toy_plugin")
    yield registry
    monkeypatch.delitem(sys.modules, "toy_plugin", raising=False)


def _one_line_error(fn, *args) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------
# The shared training keys: one declaration, one validation style.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("micro_batch_size", 0, "an integer >= 1 or null"),
        ("backend", "deepspeed", "one of ['ddp', 'fsdp']"),
        ("warmup_ratio", 2.0, "a finite number in [0, 1]"),
        ("gradient_checkpointing", "yes", "true or false"),
        ("lr", float("nan"), "a finite number > 0"),
        ("epochs", 1.5, "an integer >= 1"),
    ],
)
def test_train_config_errors_name_the_key(key, value, expected):
    message = _one_line_error(lambda: TrainConfig(**{"epochs": 1, "lr": 1e-3, "batch_size": 4, key: value}))
    assert message == f"training config: '{key}' must be {expected}, got {value!r}"


def test_missing_and_unknown_training_keys():
    assert (
        _one_line_error(TrainConfig.from_dict, {"epochs": 1}) == "training config: missing key(s) ['lr', 'batch_size']"
    )
    assert "unknown key(s) ['learning_rate']" in _one_line_error(TrainConfig.from_dict, {"learning_rate": 1})


def test_every_job_kind_composes_the_one_train_config_with_its_old_defaults():
    text = TextBaselineConfig.from_dict({"method": "ga"})
    kga = TaskLevelBaselineConfig.from_dict({"method": "kga"})
    speech = SpeechBaselineConfig.from_dict({"method": "ga"})
    for job, (epochs, lr) in ((text, (5, 1e-5)), (kga, (1, 3e-4)), (speech, (1, 1e-4))):
        assert type(job.train) is TrainConfig
        assert (job.train.epochs, job.train.lr, job.train.batch_size) == (epochs, lr, 32)
        assert (job.weight_decay, job.warmup_ratio, job.max_grad_norm, job.max_length) == (0.0, 0.0, 1.0, 128)
        assert (job.micro_batch_size, job.gradient_checkpointing, job.checkpoint_every, job.backend) == (
            None,
            False,
            0,
            "ddp",
        )
    assert kga.train_config(aux=True).epochs == 5 and kga.train_config(aux=True).lr == 2e-3  # KGA's A_f, A_n
    # no union any more: a key of another method is unknown to this one
    message = _one_line_error(SpeechBaselineConfig.from_dict, {"method": "ga", "temperature": 2.0})
    assert message.startswith("speech baseline config (ga): unknown key(s) ['temperature']")


def test_key_schema_from_the_declaration():
    assert key_schema(TrainConfig, "micro_batch_size") == {
        "oneOf": [{"type": "null"}, {"type": "integer", "minimum": 1}],
        "description": TrainConfig.__dataclass_fields__["micro_batch_size"].metadata["description"],
        "default": None,
    }
    ku = registry.hparams_of("ku", "task_level")
    assert key_schema(ku, "ma_threshold")["oneOf"][1] == {"type": "number", "minimum": 0, "maximum": 1}
    assert key_schema(registry.hparams_of("flat", "text"), "divergence")["enum"] == ["tv", "kl", "js", "pearson"]
    rmu = registry.hparams_of("rmu", "text")  # a list of integers, its bounds on each element
    node = {k: v for k, v in key_schema(rmu, "update_layers").items() if k not in ("description", "default")}
    assert node == {"type": ["array", "null"], "items": {"type": "integer", "minimum": 0}, "minItems": 1}
    assert rmu(layer=2, update_layers=[0, 2]).update_layers == (0, 2)
    for bad in ([], [0, -1], [1.0], [True]):
        with pytest.raises(
            ValueError, match=r"RmuHparams: 'update_layers' must be a non-empty list of integers, each >= 0"
        ):
            rmu(layer=2, update_layers=bad)


def test_flat_divergences_are_the_losses():
    from qrerase.baselines.losses import DIVERGENCES, flat_loss

    assert registry.hparams_of("flat", "text").__dataclass_fields__["divergence"].metadata["choices"] == DIVERGENCES
    import torch

    for name in DIVERGENCES:  # every declared choice is one flat_loss computes
        assert torch.isfinite(flat_loss(torch.tensor([0.3]), torch.tensor([0.6]), name))


def test_a_hyperparameter_may_not_shadow_a_shared_key(monkeypatch):
    from dataclasses import dataclass

    from qrerase.hparams import Hparams, hparam

    monkeypatch.setattr(registry, "_METHODS", dict(registry._METHODS))

    @dataclass
    class Bad(Hparams):
        lr: float = hparam(0.1, "a second lr", gt=0)

    with pytest.raises(registry.RegistryError, match="hyperparameter 'lr' clashes with a shared job key"):
        registry.register_method("bad", label="Bad", tracks=("tofu",), run={"text": "x:Y"}, hparams=Bad)


# ---------------------------------------------------------------------------------------------
# A plug-in's own hyperparameter: validated, in the schema and the config page, in its objective.
# ---------------------------------------------------------------------------------------------
def test_plugin_hyperparameter_is_validated(toy):
    base = {"method": "toy_scaled", "epochs": 1, "lr": 1e-3, "batch_size": 4}
    assert TextBaselineConfig.from_dict({**base, "toy_scale": 2.0}).hparams.toy_scale == 2.0
    assert TextBaselineConfig.from_dict(base).hparams.toy_scale == 0.5  # its declared default
    unknown = _one_line_error(TextBaselineConfig.from_dict, {**base, "toy_scal": 2.0})
    assert unknown.startswith("baseline config (toy_scaled): unknown key(s) ['toy_scal']; allowed: [")
    assert "'toy_scale'" in unknown
    bad = _one_line_error(TextBaselineConfig.from_dict, {**base, "toy_scale": -1})
    assert bad == "baseline config (toy_scaled): 'toy_scale' must be a finite number > 0, got -1"
    # other methods do not take it
    assert "unknown key(s) ['toy_scale']" in _one_line_error(
        TextBaselineConfig.from_dict, {**base, "method": "ga", "toy_scale": 1.0}
    )


def _config(**baselines) -> dict:
    from qrerase.workflow.plan_config import deep_update

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    deep_update(cfg, yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text()))
    cfg["tofu"]["baselines"].update(baselines)
    return cfg


def test_plugin_hyperparameter_is_in_the_schema_and_the_config_page(toy):
    from qrerase.workflow.config_docs import render
    from qrerase.workflow.validation import ConfigError, check_schema, load_schema

    schema = load_schema()
    section = schema["properties"]["tofu"]["properties"]["baselines"]["properties"]["toy_scaled"]
    assert section["properties"]["toy_scale"] == {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "s: the factor of the toy objective, L = -s x the forget NLL",
        "default": 0.5,
    }
    assert section["additionalProperties"] is False and section["required"] == ["epochs", "lr", "batch_size"]
    assert (
        "toy_scale" not in schema["properties"]["tofu"]["properties"]["baselines"]["properties"]["toy_ga"]["properties"]
    )
    ok = {"epochs": 1, "lr": 1e-3, "batch_size": 4, "toy_scale": 2.0}
    check_schema(_config(toy_scaled=ok))
    with pytest.raises(ConfigError, match=r"config key 'tofu.baselines.toy_scaled.toy_scale': .*0"):
        check_schema(_config(toy_scaled={**ok, "toy_scale": 0}))
    with pytest.raises(ConfigError, match="config key 'tofu.baselines.toy_scaled.toy_scal': unknown key"):
        check_schema(_config(toy_scaled={**ok, "toy_scal": 1.0}))
    rows = [line for line in render(schema).splitlines() if line.startswith("| `tofu.baselines.toy_scaled.toy_scale`")]
    assert len(rows) == 1 and "number > 0" in rows[0] and "the factor of the toy objective" in rows[0]


def test_plugin_hyperparameter_reaches_its_objective(toy):
    """ScaledAscent's loss on a forget batch is −toy_scale × the token-mean answer NLL, the NLL computed
    here from the model's logits with cross-entropy (not through the library's sequence_nll)."""
    import torch
    import torch.nn.functional as F
    from support.tiny_llama import build_tiny_llama

    model = build_tiny_llama(seed=0)
    forget = [([1, 5, 9, 12, 7, 2], [-100, -100, -100, 12, 7, 2]), ([1, 4, 8, 30, 2], [-100, -100, 8, 30, 2])]
    cfg = TextBaselineConfig.from_dict(
        {"method": "toy_scaled", "epochs": 1, "lr": 1e-3, "batch_size": 2, "toy_scale": 0.25}
    )
    objective = registry.implementation("toy_scaled", "text")(cfg, model, None, 0, forget, [], [], None, None)
    assert objective.hparams.toy_scale == 0.25
    with torch.no_grad():
        loss, terms = objective.full(([0, 1], None))
        total, count = 0.0, 0
        for ids, labels in forget:
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            target = torch.tensor(labels[1:])
            keep = target != -100
            total += float(F.cross_entropy(logits[keep], target[keep], reduction="sum"))
            count += int(keep.sum())
        pieces = sum(float(piece()[0]) for piece in objective.split(([0, 1], None), 2))
    assert terms["forget_nll"] == pytest.approx(total / count, rel=1e-5)
    assert float(loss) == pytest.approx(-0.25 * total / count, rel=1e-5)
    assert pieces == pytest.approx(float(loss), rel=1e-5)  # its micro-batches sum to the step's loss
