"""qrerase.text.lm: prompt encoding, batching, tokenizer and model I/O on real TOFU text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support import REPO

from qrerase.io import read_jsonl
from qrerase.models.checkpoints import save_model
from qrerase.text.lm import (
    IGNORE_INDEX,
    PromptTemplate,
    answer_token_nll,
    bucketed_batches,
    collate,
    encode_prompts,
    encode_qa,
    encode_qa_many,
    qa_pair,
)
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, load_model, load_tokenizer, train_bpe_tokenizer

DATA = REPO / "data" / "tofu"
TINY = TinyLlamaConfig(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=256,
)


@pytest.fixture(scope="module")
def records():
    return read_jsonl(DATA / "retain90.jsonl")[:40]  # two authors


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory, records):
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_bpe_tokenizer([f"{r['question']} {r['answer']}" for r in records], 400, out)
    return out


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def test_prompt_template():
    t = PromptTemplate()
    assert t.prompt("Who?") == "Question: Who?\nAnswer:"
    llama = PromptTemplate.from_dict({"question_start": "[INST] ", "question_end": " [/INST]", "answer_start": ""})
    assert llama.prompt("Who?") == "[INST] Who? [/INST]"
    with pytest.raises(ValueError, match="unknown key"):
        PromptTemplate.from_dict({"question_begin": "Q"})


def test_qa_pair_accepts_both_key_styles():
    assert qa_pair({"question": "q", "answer": "a"}) == ("q", "a")
    assert qa_pair({"prompt": "q", "response": "a"}) == ("q", "a")
    with pytest.raises(KeyError):
        qa_pair({"text": "x"})


def test_tokenizer_roundtrip_and_determinism(tok_dir, records, tmp_path):
    from transformers import AutoTokenizer

    auto = AutoTokenizer.from_pretrained(tok_dir)
    assert [auto.bos_token, auto.eos_token, auto.pad_token, auto.unk_token] == ["<s>", "</s>", "<pad>", "<unk>"]
    assert len(auto) == 400
    text = records[3]["answer"] + " Ünïcødé 05/11/1991"  # bytes never seen in training still round-trip
    ids = auto(text)["input_ids"]
    assert ids[0] == auto.bos_token_id
    assert auto.decode(ids, skip_special_tokens=True) == text
    again = train_bpe_tokenizer([f"{r['question']} {r['answer']}" for r in records], 400, tmp_path / "t2")
    assert again.get_vocab() == auto.get_vocab()
    assert (
        json.loads((tmp_path / "t2" / "tokenizer.json").read_text())["model"]["merges"]
        == json.loads((Path(tok_dir) / "tokenizer.json").read_text())["model"]["merges"]
    )


def test_encode_qa_label_masking_is_exact(tok, records):
    tpl = PromptTemplate()
    q, a = qa_pair(records[0])
    ids, labels = encode_qa(tok, tpl, q, a, max_length=256)
    prompt_ids = tok(tpl.prompt(q), add_special_tokens=False)["input_ids"]
    answer_ids = tok(" " + a, add_special_tokens=False)["input_ids"]
    assert ids == [tok.bos_token_id] + prompt_ids + answer_ids + [tok.eos_token_id]
    n_prompt = 1 + len(prompt_ids)
    assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert tok.decode(ids) == f"<s>{tpl.prompt(q)} {a}</s>"
    assert tok.decode([t for t in labels if t != IGNORE_INDEX], skip_special_tokens=True) == f" {a}"
    # generation prompts are the exact prefix
    assert encode_prompts(tok, tpl, [q])[0] == ids[:n_prompt]
    # truncation keeps the prompt and the EOS, cuts the answer
    short, short_labels = encode_qa(tok, tpl, q, a, max_length=n_prompt + 3)
    assert len(short) == n_prompt + 3 and short[-1] == tok.eos_token_id
    assert short[:-1] == ids[: n_prompt + 2] and short_labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
    # batched encoding is the same as one at a time
    many = encode_qa_many(tok, tpl, [qa_pair(r) for r in records[:5]], 256)
    assert many == [encode_qa(tok, tpl, *qa_pair(r), 256) for r in records[:5]]


def test_bucketed_batches_deterministic_and_complete():
    lengths = [5, 3, 9, 3, 7, 1, 8, 8, 2, 6, 4, 3, 10]
    b1 = bucketed_batches(lengths, 4, seed=7)
    assert b1 == bucketed_batches(lengths, 4, seed=7)
    assert sorted(i for b in b1 for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 4 for b in b1)
    # batches are contiguous ranges of the length order: no two batches interleave
    spans = sorted((min(lengths[i] for i in b), max(lengths[i] for i in b)) for b in b1)
    assert all(hi <= spans[k + 1][0] for k, (_, hi) in enumerate(spans[:-1]))
    assert any(bucketed_batches(lengths, 4, seed=s) != b1 for s in range(8, 12))
    plain = bucketed_batches(lengths, 4, seed=0, shuffle=False)
    flat = [i for b in plain for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert plain == bucketed_batches(lengths, 4, seed=99, shuffle=False)


def test_collate_right_pads():
    batch = collate([([1, 2, 3], [-100, 2, 3]), {"input_ids": [4, 5], "labels": [-100, 5]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 5, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3], [-100, 5, -100]]


def test_build_tiny_llama_and_save_load(tok, records, tmp_path):
    m1 = build_tiny_llama(TINY, tok, seed=3)
    m2 = build_tiny_llama(TINY, tok, seed=3)
    m3 = build_tiny_llama(TINY, tok, seed=4)
    assert m1.config.vocab_size == len(tok)
    assert (m1.config.bos_token_id, m1.config.eos_token_id, m1.config.pad_token_id) == (
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
    )
    assert m1.generation_config.pad_token_id == tok.pad_token_id
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    assert not torch.equal(m1.model.embed_tokens.weight, m3.model.embed_tokens.weight)
    # the answer-only NLL (LM head on answer positions) matches full-logit cross-entropy
    batch = collate(encode_qa_many(tok, PromptTemplate(), [qa_pair(r) for r in records[:3]], 128), tok.pad_token_id)
    with torch.no_grad():
        nll, mask = answer_token_nll(m1, batch)
        logits = m1(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        ref = torch.nn.functional.cross_entropy(logits[mask], batch["labels"][:, 1:][mask], reduction="none")
    assert mask.sum() == (batch["labels"] != IGNORE_INDEX).sum()
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)

    save_model(m1, tok, tmp_path / "model")
    assert (tmp_path / "model" / "model.safetensors").is_file()
    loaded, ltok = load_model(tmp_path / "model"), load_tokenizer(tmp_path / "model")
    assert not loaded.training and ltok.get_vocab() == tok.get_vocab()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=batch["input_ids"]).logits, m1(input_ids=batch["input_ids"]).logits)


@pytest.mark.parametrize("kind", ["missing", "empty_dir", "file"])
def test_load_model_bad_path_one_line_error(tmp_path, kind):
    path = {"missing": tmp_path / "nope" / "model", "empty_dir": tmp_path, "file": tmp_path / "x.txt"}[kind]
    if kind == "file":
        path.write_text("not a model")
    with pytest.raises(ValueError) as err:
        load_model(path)
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg
    with pytest.raises(ValueError, match="nope"):
        load_tokenizer(tmp_path / "nope")
