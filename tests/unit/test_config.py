"""qrerase.workflow.validation: the schema (with the registry's enums) and every cross-key check, directly."""

from __future__ import annotations

import copy

import pytest
import yaml
from support import REPO
from support.shipped import shipped_config

from qrerase import registry
from qrerase.workflow.validation import SCHEMA_PATH, ConfigError, load_schema, validate


def merged(*overrides: dict) -> dict:
    """config.yaml with Snakemake's key-by-key override (nested dicts merge, anything else replaces)."""

    def update(base, new):
        for key, value in new.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                update(base[key], value)
            else:
                base[key] = copy.deepcopy(value)

    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    for o in overrides:
        update(cfg, o)
    return cfg


def dotted(**overrides) -> dict:
    """``a__b=1`` -> ``{'a': {'b': 1}}``."""
    out: dict = {}
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split("__")
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = value
    return out


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # config paths (data/...) are relative to the working directory


def fails(cfg: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    text = str(info.value)
    assert message in text, text
    assert "\n" not in text and text.startswith("config key '")


TASK_LEVEL = yaml.safe_load((REPO / "tests" / "configs" / "test_task.yaml").read_text())


SHIPPED = [
    shipped_config(str(p.relative_to(REPO)), REPO)
    for d in ("config", "tests/configs")
    for p in sorted((REPO / d).glob("*.yaml"))
]


@pytest.mark.parametrize("name", ["default", *SHIPPED])
def test_every_shipped_config_is_valid(name):
    extra = [] if name == "default" else [yaml.safe_load((REPO / name).read_text())]
    validate(merged(*extra))


@pytest.mark.parametrize(
    "overrides, message",
    [
        # the schema, with the registry's enums
        (dict(methods={"tofu": ["qr_erase", "magic"]}), "config key 'methods.tofu.1': 'magic' is not one of"),
        (dict(methods={"tofu": ["qr_erase"], "speech": ["qr_erase", "npo"]}), "config key 'methods.speech.1'"),
        (dict(tracks=["tofu", "vision"]), "config key 'tracks.1'"),
        (dotted(unlearn__control=["ga"]), "config key 'unlearn.control.0'"),
        (dotted(crosslingual__table_method="npo"), "config key 'crosslingual.table_method'"),
        (dotted(tofu__data__n_authors=1), "config key 'tofu.data.n_authors'"),
        (dotted(speech__forget_fraction=1.5), "config key 'speech.forget_fraction'"),
        (dotted(speech__forget_fraction=0), "config key 'speech.forget_fraction'"),
        (dotted(tofu__baselines__npo__beta=0), "config key 'tofu.baselines.npo.beta'"),
        # DeepSpeed was removed from the backends until it can be tested (docs/training-engine.md)
        (
            dotted(finetune__backend="deepspeed"),
            "config key 'finetune.backend': 'deepspeed' is not one of ['ddp', 'fsdp']",
        ),
        (
            dotted(tofu__baselines__kl__backend="deepspeed"),
            "config key 'tofu.baselines.kl.backend': 'deepspeed' is not one of",
        ),
        # core
        (dotted(unlearn__rank=99), "config key 'unlearn.rank': 99 exceeds the LoRA rank"),
        (dotted(unlearn__retain_rank=99), "config key 'unlearn.retain_rank': 99 exceeds the LoRA rank"),
        (dotted(model__tiny__hidden_size=30), "config key 'model.tiny.hidden_size': must be divisible"),
        (dotted(model__tiny__num_key_value_heads=3), "config key 'model.tiny.num_key_value_heads': must divide"),
        (dotted(tofu__data__root="/no/such/dir"), "config key 'tofu.data.root': data file /no/such/dir/"),
        (
            dotted(tofu__data__n_authors=8, tofu__data__forget_authors=8),
            "config key 'tofu.data.forget_authors': expected 1..7",
        ),
        (dotted(probe__epochs=[0, 5]), "config key 'probe.epochs.0'"),
        (
            dotted(lora__adapters__forget="/no/such/adapter"),
            "config key 'lora.adapters.forget': /no/such/adapter: adapter directory not found",
        ),
        (
            dotted(tofu__imported_models=[{"name": "x", "log": "/no/such/log"}]),
            "config key 'tofu.imported_models[x].log': /no/such/log not found",
        ),
        # crosslingual
        (dict(methods={"tofu": ["qr_erase"], "crosslingual": None}), "config key 'methods.crosslingual'"),
        (dotted(crosslingual__languages=["en", "xx"]), "config key 'crosslingual.languages[1]': unknown language 'xx'"),
        (
            dotted(crosslingual__unlearn=["fr"], crosslingual__languages=["en", "hi"]),
            "config key 'crosslingual.unlearn[0]': 'fr' is not in crosslingual.languages",
        ),
        (
            dict(methods={"crosslingual": ["qr_erase"]}),
            "config key 'crosslingual.table_method': 'qr_erase_ll' is not in",
        ),
        (dotted(crosslingual__data__root="/no/such/mtofu"), "config key 'crosslingual.data.root'"),
        # speech
        (dotted(speech__rank=99), "config key 'speech.rank(s)': rank 99 exceeds the LoRA rank"),
        (dotted(speech__rank_settings=["class"], speech__settings=["sample"]), "config key 'speech.rank_settings'"),
        (
            dotted(speech__tradeoff__settings=["class"], speech__settings=["sample"], speech__rank_settings=[]),
            "config key 'speech.tradeoff.settings'",
        ),
        (dotted(speech__data__root="/no/such/dir"), "config key 'speech.data.root': /no/such/dir"),
        (dotted(speech__forget_speakers=["alice"]), "config key 'speech.forget_speakers': speaker 'alice' not in"),
        (dotted(speech__top_k=1000), "config key 'speech.top_k': 1000 exceeds the number of speakers"),
        # baselines
        (
            dotted(tofu__baselines__npo=None),
            "config key 'methods.tofu.3': baseline 'npo' has no 'tofu.baselines.npo' settings",
        ),
        (
            dotted(tofu__baselines__refusals="/no/such/idk.txt"),
            "config key 'tofu.baselines.refusals': /no/such/idk.txt not found",
        ),
        # trade-off
        (dotted(tradeoff__scales=[0.5, 1.0]), "config key 'tradeoff.scales': must include 0"),
    ],
)
def test_every_check_names_its_key(overrides, message):
    fails(merged(overrides), message)


def test_crosslingual_track_needs_its_section():
    cfg = merged()
    del cfg["crosslingual"]
    fails(cfg, "config key 'crosslingual': the crosslingual track needs a 'crosslingual' section")


def test_all_speakers_forgotten_is_an_error():
    from qrerase.tracks.speech.data import list_recordings

    cfg = merged()
    speakers = sorted(
        {r.speaker for r in list_recordings(cfg["speech"]["data"]["root"], cfg["speech"]["data"].get("max_per_digit"))}
    )
    cfg["speech"]["forget_speakers"] = speakers
    fails(cfg, "config key 'speech.forget_speakers': at least one speaker must be retained")


def test_data_checks_only_for_the_tracks_that_run():
    validate(merged(dict(tracks=["tofu"]), dotted(speech__data__root="/no/such/dir", crosslingual__data__root="/no")))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dotted(task_level__data__forget="algebra"), "config key 'task_level.data.forget': unknown skill 'algebra'"),
        (dotted(task_level__rank=99), "config key 'task_level.rank': 99 exceeds the LoRA rank"),
        (
            dotted(task_level__baselines__kga=None),
            "config key 'methods.task_level.1': baseline 'kga' has no 'task_level.baselines.kga' settings",
        ),
    ],
)
def test_task_checks(overrides, message):
    fails(merged(TASK_LEVEL, overrides), message)


def test_task_track_needs_its_methods():
    cfg = merged(TASK_LEVEL)
    del cfg["methods"]["task_level"]
    fails(cfg, "config key 'task_level': the task-level track needs a 'task_level' section and 'methods.task_level'")


def test_schema_file_lists_no_method_names_and_the_loader_injects_the_registry():
    text = SCHEMA_PATH.read_text()
    assert "qr_erase" not in text  # (baselines keep their settings sections, not an enum of names)
    assert not any("enum" in line and "ga" in line.split("enum", 1)[1] for line in text.splitlines())
    schema = load_schema()
    methods = schema["properties"]["methods"]["properties"]
    for track in registry.TRACKS:
        assert methods[track]["items"]["enum"] == registry.methods_for(track)
    assert schema["properties"]["tracks"]["items"]["enum"] == ["tofu", "crosslingual", "speech", "task_level"]
    assert schema["properties"]["unlearn"]["properties"]["control"]["items"]["enum"] == [
        "unlearn",
        "unlearn_ll",
        "qr_erase",
        "qr_erase_ll",
    ]
    assert "x-registry" not in str(schema)
    load_schema()["properties"].clear()  # a copy: the cached schema stays whole
    assert "methods" in load_schema()["properties"]


def test_the_schema_is_read_as_yaml_safe_load_reads_it():
    """The loader's fast path (libyaml's CSafeLoader, where PyYAML has it) gives the schema that the
    pure-Python ``yaml.safe_load`` gives, registry injection included."""
    from qrerase.workflow.validation import _inject

    assert load_schema() == _inject(yaml.safe_load(SCHEMA_PATH.read_text()))


# ---------------------------------------------------------------------------------------------
# Every object of the schema is closed: a misspelt key anywhere is refused, naming it.
# ---------------------------------------------------------------------------------------------
# A config holding an instance of every object the schema knows (the default config.yaml, the task-level
# test config and the optional sections the default leaves out). A new object in the schema fails the
# test below until an instance of it is added here.
_EVERY_OBJECT = merged(
    TASK_LEVEL,
    dict(tracks=["tofu", "crosslingual", "speech", "task_level"]),
    dotted(
        model__shape=dict(layers=2, hidden=32, intermediate=64, vocab=400, heads=2, kv_heads=2),
        speech__model__shape=dict(layers=2, hidden=32, intermediate=64, vocab=0, heads=2, kv_heads=2),
        finetune__lora=dict(r=4, alpha=8, target_modules="auto"),
        tofu__imported_models=[{"name": "other", "log": "config.yaml"}],
        construction=dict(
            starts=["finetuned"],
            projectors=["k"],
            ranks=[2],
            methods=["qr_erase"],
            scales=[1],
            stop_rise=0.5,
            protocol_ranks=[],
            baselines=[],
            epochs=[],
        ),
    ),
)


def _is_object(schema: dict, node: dict) -> bool:
    from qrerase.workflow.schema_keys import resolve_ref

    if "$ref" in node and _is_object(schema, resolve_ref(schema, node["$ref"])):
        return True
    types = node.get("type", [])
    if "object" in ([types] if isinstance(types, str) else types) or "properties" in node:
        return True
    return any(_is_object(schema, b) for k in ("allOf", "oneOf", "anyOf") for b in node.get(k, []))


def _instance(cfg: dict, path: str) -> tuple[dict | None, str]:
    """The object at a config_keys path (``a[].b``: the first item; ``a.<name>``: the first key) and its
    dotted key as the validator names it."""
    node: object = cfg
    keys: list[str] = []
    for part in path.replace("[]", ".[]").split(".") if path else []:
        if not isinstance(node, (dict, list)) or not node:
            return None, ""
        if part == "[]":
            node, key = (node[0], "0") if isinstance(node, list) else (None, "")
        elif part == "<name>":
            key = next(iter(node))
            node = node[key]
        else:
            node, key = (node.get(part), part) if isinstance(node, dict) else (None, "")
        keys.append(key)
    return (node if isinstance(node, dict) else None), ".".join(keys)


def test_every_object_of_the_schema_refuses_an_unknown_key():
    from qrerase.workflow.config_docs import config_keys

    schema = load_schema()
    validate(copy.deepcopy(_EVERY_OBJECT))  # valid as it is
    keys = config_keys(schema)
    paths = ["", *(k.path for k in keys if _is_object(schema, k.node))]
    paths += [f"{k.path}[]" for k in keys if _is_object(schema, k.node.get("items", {}))]  # lists of objects
    missing = [p for p in paths if _instance(_EVERY_OBJECT, p)[0] is None]
    assert not missing, f"no instance of these schema objects in _EVERY_OBJECT: {missing}"
    for path in paths:
        cfg = copy.deepcopy(_EVERY_OBJECT)
        node, key = _instance(cfg, path)
        node["zz_typo"] = 1
        full = f"{key}.zz_typo" if key else "zz_typo"
        fails(cfg, f"config key '{full}': unknown key")
    assert {"pretrain", "finetune", "lora", "speech.lora", "task_level.lora", "tofu.imported_models[]"} <= set(paths)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dotted(lora__rnk=4), "config key 'lora.rnk': unknown key"),
        (
            dotted(finetune__checkpoint_evry=2),
            "config key 'finetune.checkpoint_evry': unknown key (did you mean 'checkpoint_every'?",
        ),
        (dotted(pretrain__epoch=3), "config key 'pretrain.epoch': unknown key (did you mean 'epochs'?"),
        (dotted(speech__finetune__freeze_feature_encodr=True), "config key 'speech.finetune.freeze_feature_encodr'"),
        (
            dotted(task_level__data__sizes__arithmatic=dict(train=1, eval=1, new=1)),
            "'task_level.data.sizes.arithmatic'",
        ),
    ],
)
def test_a_misspelt_training_key_is_refused(overrides, message):
    fails(merged(overrides), message)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_no_preset_downloads_a_model_in_a_job(name):
    """Compute nodes may have no internet and gated ids need a token: the presets read the model from
    the Hugging Face cache, fetched once on a login node (docs/cluster.md, "Fetch the model once")."""
    cfg = merged(yaml.safe_load((REPO / "config" / name).read_text()))
    assert cfg["model"]["local_files_only"] is True
    assert cfg["speech"]["model"].get("local_files_only", True) is True
    # planning checks such a model is in the Hugging Face cache: the suite's cache (tests/conftest.py) has it
    from huggingface_hub import try_to_load_from_cache

    from qrerase.models.checkpoint_files import is_local_path

    for model in (cfg["model"], cfg["speech"]["model"]):
        hub_id = model.get("name_or_path")
        if hub_id and not is_local_path(hub_id) and not str(hub_id).startswith("package:"):
            assert isinstance(try_to_load_from_cache(hub_id, "config.json"), str), (
                f"add {hub_id} to tests/support/hub_cache"
            )
