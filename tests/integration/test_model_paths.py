"""Model / tokenizer / adapter paths of the config are checked at planning time with the checks the
jobs' loaders make; errors are one line naming the key and the path. A hub id is accepted unchecked."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO
from support.tiny_hubert import TINY_HUBERT

from qrerase.workflow.validation import ConfigError, validate

DEFAULT = yaml.safe_load((REPO / "config.yaml").read_text())


def config(**sections) -> dict:
    """config.yaml on the TOFU track only, with ``model``/``lora``/``speech`` entries replaced."""
    cfg = copy.deepcopy(DEFAULT)
    cfg["tracks"] = ["tofu"]
    for dotted, value in sections.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node[key]
        node[leaf] = value
    return cfg


def refused(cfg: dict, *parts: str) -> str:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    text = str(info.value)
    assert "\n" not in text
    for part in parts:
        assert part in text, text
    return text


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # config paths (data/...) are relative to the working directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A real tiny Llama checkpoint with its tokenizer (as the workflow's finetune saves it)."""
    from qrerase.io import read_jsonl
    from qrerase.models.checkpoints import save_model
    from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer

    root = tmp_path_factory.mktemp("ckpt")
    rows = read_jsonl(REPO / "data" / "tofu" / "retain90.jsonl")[:20]
    tok = train_bpe_tokenizer([f"{r['question']} {r['answer']}" for r in rows], 400, root / "tokenizer")
    cfg = TinyLlamaConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    model = build_tiny_llama(cfg, tok, seed=0)
    save_model(model, tok, root / "model")
    model.save_pretrained(root / "sharded", max_shard_size="20KB")  # model.safetensors.index.json + shards
    tok.save_pretrained(root / "sharded")
    return root


def test_a_real_checkpoint_passes(checkpoint):
    validate(config(model__name_or_path=str(checkpoint / "model")))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("empty", "empty directory, expected a model directory"),
        ("tokenizer_only", "no config.json, not a model directory (it holds a tokenizer only)"),
        ("file", "is a file, expected a model directory"),
        ("no_weights", "no weights (none of model.safetensors"),
        ("no_tokenizer", "no tokenizer (none of tokenizer_config.json, tokenizer.json)"),
        ("missing", "no such model directory"),
    ],
)
def test_bad_model_paths_name_the_key_and_the_path(checkpoint, tmp_path, kind, message):
    path = tmp_path / kind
    if kind == "empty":
        path.mkdir()
    elif kind == "tokenizer_only":
        shutil.copytree(checkpoint / "tokenizer", path)
    elif kind == "file":
        path.write_text("not a model")
    elif kind == "no_weights":
        shutil.copytree(checkpoint / "model", path, ignore=shutil.ignore_patterns("*.safetensors"))
    elif kind == "no_tokenizer":
        shutil.copytree(checkpoint / "model", path, ignore=shutil.ignore_patterns("tokenizer*", "special_tokens*"))
    refused(config(model__name_or_path=str(path)), f"config key 'model.name_or_path': {path}: {message}")


@pytest.mark.parametrize("kind", ["empty", "file"])
def test_the_job_loader_gives_the_same_message(tmp_path, kind):
    from qrerase.text.models import load_model

    path = tmp_path / kind
    path.mkdir() if kind == "empty" else path.write_text("x")
    planning = refused(config(model__name_or_path=str(path)), "config key 'model.name_or_path': ")
    with pytest.raises(ValueError) as info:
        load_model(path)
    assert planning.endswith(str(info.value))


def test_a_hub_id_is_accepted_without_network_where_jobs_may_download_it():
    # not a local path and shaped like a hub id: left to the job, which downloads it
    validate(config(model__name_or_path="some-org/some-model-that-is-not-here", model__local_files_only=False))


def test_an_uncached_hub_id_under_local_files_only_fails_planning_in_one_line():
    """The first job would fail on it (issue 51, case 5): refused at planning, through huggingface_hub's
    cache lookup (no network, no torch). The suite's cache holds the presets' models (tests/conftest.py)."""
    validate(config(model__name_or_path="meta-llama/Meta-Llama-3-8B", model__local_files_only=True))
    message = refused(
        config(model__name_or_path="some-org/some-model-that-is-not-here", model__local_files_only=True),
        "config key 'model.name_or_path': 'some-org/some-model-that-is-not-here' is not in the Hugging Face cache (",
        "and model.local_files_only is true; download it first (hf download some-org/some-model-that-is-not-here)",
    )
    assert "\n" not in message
    cfg = config(speech__model__name_or_path="some-org/no-speech-model", speech__model__local_files_only=True)
    cfg["tracks"] = ["tofu", "speech"]
    refused(cfg, "config key 'speech.model.name_or_path': 'some-org/no-speech-model' is not in the Hugging Face cache")


def test_speech_model_path_is_checked_when_the_track_runs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = config(speech__model__name_or_path=str(empty))
    validate(cfg)  # the speech track does not run: its model is not needed
    cfg["tracks"] = ["tofu", "speech"]
    refused(cfg, f"config key 'speech.model.name_or_path': {empty}: empty directory, expected a speech model directory")
    _tiny_hubert(tmp_path / "hubert")
    cfg["speech"]["model"]["name_or_path"] = str(tmp_path / "hubert")
    validate(cfg)  # no tokenizer needed for a speech model


# ---------------------------------------------------------------------------------------------
# A config.json that disagrees with its weights: refused at planning time (from the safetensors headers)
# and by the job's loader (from_pretrained's loading info), never loaded truncated or partly random.
# ---------------------------------------------------------------------------------------------
def edited(src: Path, dest: Path, **changes) -> Path:
    """A copy of the checkpoint folder ``src`` with ``config.json`` keys changed."""
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(changes)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


@pytest.mark.parametrize(
    "source, changes, message",
    [
        ("model", dict(num_hidden_layers=1), "num_hidden_layers is 1 but model.safetensors holds 2 layers"),
        ("model", dict(num_hidden_layers=3), "num_hidden_layers is 3 but model.safetensors holds 2 layers"),
        ("model", dict(vocab_size=512), "vocab_size is 512 but model.safetensors holds a token embedding of 400 rows"),
        ("model", dict(hidden_size=32), "hidden_size is 32 but model.safetensors holds a token embedding of width 16"),
        ("sharded", dict(num_hidden_layers=1), "num_hidden_layers is 1 but model.safetensors.index.json holds 2"),
    ],
)
def test_a_config_json_that_disagrees_with_its_weights_is_refused_at_planning(
    checkpoint, tmp_path, source, changes, message
):
    assert (checkpoint / "sharded" / "model.safetensors.index.json").is_file()
    validate(config(model__name_or_path=str(checkpoint / source)))  # as saved: valid
    path = edited(checkpoint / source, tmp_path / "edited", **changes)
    refused(
        config(model__name_or_path=str(path)), f"config key 'model.name_or_path': {path / 'config.json'}: {message}"
    )


@pytest.mark.parametrize(
    "layers, message",
    [
        (1, "weights the model has no place for (they would be dropped): model.layers.1."),
        (3, "weights missing from the checkpoint (they would be random): model.layers.2."),
    ],
)
@pytest.mark.parametrize("source", ["model", "sharded"])
def test_the_text_loader_refuses_weights_that_do_not_match_the_config(checkpoint, tmp_path, source, layers, message):
    from qrerase.text.models import load_model

    assert load_model(checkpoint / source).config.num_hidden_layers == 2
    path = edited(checkpoint / source, tmp_path / "edited", num_hidden_layers=layers)
    with pytest.raises(ValueError) as info:
        load_model(path)
    text = str(info.value)
    assert text.startswith(f"{path}: the weights do not match its config.json; {message}") and "\n" not in text


def _tiny_hubert(out: Path, speakers=("a", "b")) -> Path:
    from qrerase.tracks.speech import model as sm

    sm.save_speech_model(sm.build_tiny_hubert(sm.TinyHubertConfig(**TINY_HUBERT), list(speakers), 0), out)
    return out


def test_a_speech_checkpoint_that_disagrees_with_its_config_is_refused(tmp_path):
    from qrerase.tracks.speech.model import load_speech_model

    hubert = _tiny_hubert(tmp_path / "hubert")
    cfg = config(speech__model__name_or_path=str(hubert))
    cfg["tracks"] = ["tofu", "speech"]
    validate(cfg)
    assert load_speech_model(hubert).config.num_hidden_layers == 2
    assert load_speech_model(hubert, speakers=["a", "b", "c"]).config.num_labels == 3  # a new head: allowed
    for layers, message in ((1, "they would be dropped): hubert.encoder.layers.1."), (3, "random): hubert.encoder")):
        path = edited(hubert, tmp_path / f"layers{layers}", num_hidden_layers=layers)
        cfg["speech"]["model"]["name_or_path"] = str(path)
        refused(cfg, f"{path / 'config.json'}: num_hidden_layers is {layers} but model.safetensors holds 2 layers")
        for speakers in (None, ["a", "b", "c"]):
            with pytest.raises(ValueError) as info:
                load_speech_model(path, speakers=speakers)
            assert str(info.value).startswith(f"{path}: the weights do not match its config.json; ")
            assert message in str(info.value) and "\n" not in str(info.value)
    path = edited(hubert, tmp_path / "wide", hidden_size=32)
    cfg["speech"]["model"]["name_or_path"] = str(path)
    refused(cfg, f"{path / 'config.json'}: hidden_size is 32 but model.safetensors holds an encoder of width 16")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    from support.tiny_llama import save_random_lora

    out, _ = save_random_lora(tmp_path_factory.mktemp("adapter") / "forget", seed=1)
    return out


def test_a_real_adapter_passes(adapter):
    validate(config(lora__adapters={"forget": str(adapter), "retain": None}))


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "adapter directory not found"),
        ("file", "adapter directory not found"),
        ("empty", "adapter_config.json: adapter config not found"),
        ("no_weights", "adapter_model.safetensors: adapter weights not found"),
        ("pickle", "adapter_model.bin: pickle adapters are not supported"),
        ("corrupt", "adapter_model.safetensors: not a readable safetensors file"),
        ("bad_config", "adapter_config.json: not a readable JSON adapter config"),
    ],
)
def test_bad_adapters_name_the_key_and_the_path(adapter, tmp_path, kind, message):
    path = tmp_path / kind
    if kind == "file":
        path.write_text("x")
    elif kind == "empty":
        path.mkdir()
    elif kind != "missing":
        shutil.copytree(adapter, path)
        weights = path / "adapter_model.safetensors"
        if kind in ("no_weights", "pickle"):
            weights.unlink()
        if kind == "pickle":
            (path / "adapter_model.bin").write_bytes(b"\x80\x04pickle payload")
        if kind == "corrupt":
            weights.write_bytes(weights.read_bytes()[:20])
        if kind == "bad_config":
            (path / "adapter_config.json").write_text("{not json")
    refused(
        config(lora__adapters={"forget": str(path), "retain": None}),
        "config key 'lora.adapters.forget': ",
        str(path),
        message,
    )


def test_a_bad_model_path_fails_the_dry_run_and_writes_nothing(tmp_path):
    empty = tmp_path / "empty_model"
    empty.mkdir()
    cfg = yaml.safe_load((REPO / "tests" / "configs" / "test.yaml").read_text())
    cfg["tofu"]["data"]["root"] = str(REPO / "data" / "tofu")
    cfg["model"]["name_or_path"] = str(empty)
    work = tmp_path / "work"
    work.mkdir()
    (work / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "-s",
            str(REPO / "Snakefile"),
            "--directory",
            str(work),
            "-n",
            "--cores",
            "1",
            "--configfile",
            str(work / "bad.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode != 0
    assert (
        f"config key 'model.name_or_path': {empty}: empty directory, expected a model directory"
        in proc.stdout + proc.stderr
    )
    assert not (work / "results").exists() and not any(empty.iterdir())


def _with_config(adapter, dest, **changes):
    """A copy of ``adapter`` whose adapter_config.json has ``changes``."""
    shutil.copytree(adapter, dest)
    path = dest / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return dest


def test_an_adapter_trained_on_another_model_is_refused_naming_both(adapter, checkpoint, tmp_path):
    """Issue 51, case 3: the shapes of the tiny model match, the base named in the adapter does not."""
    other = _with_config(adapter, tmp_path / "llama3", base_model_name_or_path="meta-llama/Meta-Llama-3-8B")
    cfg = config(lora__adapters={"forget": str(other), "retain": None})
    refused(
        cfg,
        f"config key 'lora.adapters.forget': adapter {other} was trained on 'meta-llama/Meta-Llama-3-8B', "
        "but model.name_or_path is the tiny model this workflow builds; set lora.accept_other_base: true",
    )
    cfg["lora"]["accept_other_base"] = True
    validate(cfg)
    # a local copy of the same hub model is the same model (by name, or by the config.json it was saved with)
    local = tmp_path / "models" / "Meta-Llama-3-8B"
    shutil.copytree(checkpoint / "model", local)
    validate(config(model__name_or_path=str(local), lora__adapters={"forget": str(other), "retain": None}))
    renamed = tmp_path / "models" / "my-llama"
    shutil.copytree(local, renamed)
    saved = json.loads((renamed / "config.json").read_text())
    (renamed / "config.json").write_text(json.dumps({**saved, "_name_or_path": "meta-llama/Meta-Llama-3-8B"}))
    validate(config(model__name_or_path=str(renamed), lora__adapters={"forget": str(other), "retain": None}))
    elsewhere = tmp_path / "models" / "Mixtral-8x7B"
    shutil.copytree(checkpoint / "model", elsewhere)
    refused(
        config(model__name_or_path=str(elsewhere), lora__adapters={"forget": None, "retain": str(other)}),
        f"config key 'lora.adapters.retain': adapter {other} was trained on 'meta-llama/Meta-Llama-3-8B', "
        f"but model.name_or_path is '{elsewhere}'",
    )
    # an adapter trained here on a workflow checkpoint (a local folder) fits the tiny model
    ours = _with_config(adapter, tmp_path / "ours", base_model_name_or_path="results/tofu_forget10/models/full")
    validate(config(lora__adapters={"forget": str(ours), "retain": None}))


def test_a_rank_above_a_user_adapters_rank_fails_planning_naming_the_key(adapter, tmp_path):
    """Issue 51, case 6: unlearn.rank 8 with a rank-4 adapter failed only in the factors job."""
    refused(
        config(unlearn__rank=8, lora__adapters={"forget": str(adapter), "retain": None}),
        "config key 'unlearn.rank': 8 exceeds the LoRA rank 4 of module ",
        f"in lora.adapters.forget ({adapter}); its task matrix has rank at most 4",
    )
    validate(config(unlearn__rank=4, lora__adapters={"forget": str(adapter), "retain": None}))
    # rank_pattern applies: one module of rank 2 bounds the retain projector's rank max(rank, retain_rank)
    low = _with_config(adapter, tmp_path / "low", rank_pattern={"model.layers.0.self_attn.q_proj": 2})
    refused(
        config(unlearn__rank=2, unlearn__retain_rank=3, lora__adapters={"forget": None, "retain": str(low)}),
        "config key 'unlearn.retain_rank': 3 exceeds the LoRA rank 2 of module 'model.layers.0.self_attn.q_proj' "
        f"in lora.adapters.retain ({low})",
    )


def test_a_model_folder_with_pickle_weights_only_is_refused_at_planning_and_by_the_loader(checkpoint, tmp_path):
    """Issue 62: a folder holding only pytorch_model.bin planned (rc 0) and was unpickled by load_model."""
    import torch

    from qrerase.text.models import load_model

    path = tmp_path / "pickled"
    shutil.copytree(checkpoint / "model", path, ignore=shutil.ignore_patterns("*.safetensors"))
    torch.save({"model.embed_tokens.weight": torch.zeros(2, 2)}, path / "pytorch_model.bin")
    planning = refused(
        config(model__name_or_path=str(path)),
        f"config key 'model.name_or_path': {path}: pickle weights (pytorch_model.bin) are not supported",
        "convert the folder to safetensors",
    )
    with pytest.raises(ValueError) as info:
        load_model(path)
    assert planning.endswith(str(info.value))


@pytest.mark.parametrize("name", ["npo", "retain", "base", "qr_erase_k4", "qr_erase_ll_control_k2", "twin"])
def test_an_imported_models_name_that_collides_is_refused_naming_the_key(name):
    """Issue 62: `tofu.imported_models[].name: npo` planned, and its metrics overwrote NPO's."""
    log = "data/tofu_reference_logs"
    items = [{"name": "twin", "log": log}, {"name": name, "log": log}]
    refused(config(tofu__imported_models=items), "config key 'tofu.imported_models[1].name'", repr(name))
    validate(config(tofu__imported_models=[{"name": "published_npo", "log": log}]))  # a name of its own passes


def test_the_tofu_data_is_checked_only_where_the_track_runs(tmp_path):
    """Issue 62: a speech-only plan failed outside the checkout on tofu.data.root, a track it does not run."""
    cfg = config(tofu__data__root=str(tmp_path / "nowhere"))
    refused(copy.deepcopy(cfg), "config key 'tofu.data.root'")
    cfg["tracks"] = ["task_level"]
    validate(cfg)
