"""Artifacts honour the umask: the atomic writer's files and folders get the mode a plain open/mkdir
would give (mkstemp/mkdtemp alone make them 0600/0700, private to their owner)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pandas as pd
import pytest

from qrerase import io


@pytest.fixture(params=[0o022, 0o002], ids=["umask022", "umask002"])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_current_umask_reads_without_changing(umask):
    assert io.current_umask() == umask
    assert io.current_umask() == umask


def test_files_get_the_mode_of_a_plain_open(tmp_path, umask):
    (tmp_path / "plain.txt").write_text("x")
    plain = _mode(tmp_path / "plain.txt")
    assert plain == 0o666 & ~umask
    io.write_text(tmp_path / "a.txt", "x")
    io.write_json(tmp_path / "sub" / "b.json", {"k": 1})
    io.write_csv(tmp_path / "c.csv", pd.DataFrame({"a": [1.0]}))
    io.save_arrays(tmp_path / "d.safetensors", {"w": np.zeros(3, dtype=np.float32)}, {"m": "1"})
    io.write_jsonl(tmp_path / "e.jsonl", [{"q": "a"}])
    for name in ("a.txt", "sub/b.json", "c.csv", "d.safetensors", "e.jsonl"):
        assert _mode(tmp_path / name) == plain, name
    io.write_text(tmp_path / "a.txt", "again")  # a replaced artifact too
    assert _mode(tmp_path / "a.txt") == plain


def test_folders_get_the_mode_of_a_plain_mkdir(tmp_path, umask):
    (tmp_path / "plain").mkdir()
    plain_dir = _mode(tmp_path / "plain")
    assert plain_dir == 0o777 & ~umask
    for _ in range(2):  # created, then replaced whole
        with io.atomic_dir(tmp_path / "ckpt") as tmp:
            (tmp / "inner").mkdir()
            (tmp / "inner" / "f.bin").write_bytes(b"1")
            io.write_json(tmp / "meta.json", {})
        assert _mode(tmp_path / "ckpt") == plain_dir
        assert _mode(tmp_path / "ckpt" / "inner") == plain_dir
        assert _mode(tmp_path / "ckpt" / "inner" / "f.bin") == 0o666 & ~umask
        assert _mode(tmp_path / "ckpt" / "meta.json") == 0o666 & ~umask
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "plain"]  # no temporaries left


def test_a_saved_checkpoint_is_readable_by_the_group(tmp_path, umask):
    from support.tiny_llama import build_tiny_llama
    from transformers import PreTrainedTokenizerFast  # noqa: F401  (the real save path)

    from qrerase.models.checkpoints import save_model

    save_model(build_tiny_llama(0), None, tmp_path / "model")
    paths = [tmp_path / "model", *(tmp_path / "model").rglob("*")]
    assert len(paths) >= 3  # the folder, config.json, model.safetensors (+ generation_config.json)
    for p in paths:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert _mode(p) == want, p
        assert _mode(p) & stat.S_IRGRP
