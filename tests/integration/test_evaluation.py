"""qrerase.text.evaluation: TOFU eval-log fields on small real TOFU eval sets."""

from __future__ import annotations

import json
import math

import pytest
import torch
from support import REPO

from qrerase.io import read_jsonl, write_json
from qrerase.text.evaluation import EvalConfig, answer_losses, evaluate_log, evaluate_set, greedy_generate
from qrerase.text.lm import PromptTemplate, encode_prompts, encode_qa
from qrerase.text.models import TinyLlamaConfig, build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import TrainConfig, train_causal_lm

DATA = REPO / "data" / "tofu"
TPL = PromptTemplate()


@pytest.fixture(scope="module")
def eval_sets():
    return {
        "forget": read_jsonl(DATA / "forget10_perturbed.jsonl")[380:392],
        "retain": read_jsonl(DATA / "retain_perturbed.jsonl")[:10],
        "real_authors": read_jsonl(DATA / "real_authors_perturbed.jsonl")[:6],
        "world_facts": read_jsonl(DATA / "world_facts_perturbed.jsonl")[:7],
    }


@pytest.fixture(scope="module")
def tok_model(tmp_path_factory, eval_sets):
    recs = [r for rs in eval_sets.values() for r in rs]
    tok = train_bpe_tokenizer(
        [f"{r['question']} {r['answer']}" for r in recs], 500, tmp_path_factory.mktemp("t") / "tok"
    )
    model = build_tiny_llama(
        TinyLlamaConfig(
            hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2
        ),
        tok,
        seed=0,
    )
    # a little training so that generations are not degenerate and stop at EOS sometimes
    train_causal_lm(model, tok, recs, TPL, TrainConfig(epochs=8, lr=5e-3, batch_size=8, seed=0, threads=1), desc="prep")
    return tok, model


def _pairs(eval_sets):
    return [(r["question"], a) for r in eval_sets["forget"] for a in [r["answer"], *r["perturbed_answer"]]]


def test_batched_losses_equal_unbatched(tok_model, eval_sets):
    tok, model = tok_model
    pairs = _pairs(eval_sets)
    batched = answer_losses(model, tok, TPL, pairs, EvalConfig(batch_size=16))
    single = answer_losses(model, tok, TPL, pairs, EvalConfig(batch_size=1))
    assert [n for _, n in batched] == [n for _, n in single]
    for (s1, _), (s2, _) in zip(batched, single):
        assert math.isclose(s1, s2, rel_tol=1e-5, abs_tol=1e-5)
    # and equal to a plain full-logit computation of one pair
    q, a = pairs[3]
    ids, labels = encode_qa(tok, TPL, q, a, None)  # EvalConfig.max_length None: no cap
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
    target = torch.tensor(labels[1:])
    keep = target != -100
    ref = torch.nn.functional.cross_entropy(logits[keep], target[keep], reduction="sum")
    assert batched[3][1] == int(keep.sum()) and math.isclose(batched[3][0], float(ref), rel_tol=1e-5)


def _manual_greedy(model, tok, question, max_new):
    ids = torch.tensor([encode_prompts(tok, TPL, [question])[0]])
    new = []
    with torch.no_grad():
        for _ in range(max_new):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return tok.decode(new, skip_special_tokens=True).strip()


def test_generation_decodes_only_new_tokens(tok_model, eval_sets):
    tok, model = tok_model
    questions = [r["question"] for r in eval_sets["forget"][:4] + eval_sets["world_facts"][:3]]
    side = tok.padding_side
    out = greedy_generate(model, tok, TPL, questions, EvalConfig(batch_size=4, max_new_tokens=12))
    assert tok.padding_side == side
    assert len(out) == len(questions)
    assert out == [_manual_greedy(model, tok, q, 12) for q in questions]
    assert not any(o.startswith("Question:") or q in o for o, q in zip(out, questions))


def test_evaluate_log_fields(tok_model, eval_sets, tmp_path):
    tok, model = tok_model
    logs = evaluate_log(model, tok, TPL, eval_sets, EvalConfig(batch_size=8, max_new_tokens=8))
    names = {
        "forget": "eval_log_forget.json",
        "retain": "eval_log.json",
        "real_authors": "eval_real_author_wo_options.json",
        "world_facts": "eval_real_world_wo_options.json",
    }
    assert set(logs) == set(names.values())
    fields = {
        "avg_gt_loss",
        "gt_loss",
        "num_token_gt",
        "avg_paraphrased_loss",
        "paraphrased_loss",
        "num_token_paraphrased",
        "average_perturb_loss",
        "perturb_loss",
        "num_token_perturb",
        "rouge1_recall",
        "rougeL_recall",
        "generated_text",
    }
    for key, fname in names.items():
        log, recs = logs[fname], eval_sets[key]
        assert set(log) == fields
        for field, values in log.items():
            assert list(values) == [str(i) for i in range(len(recs))], field
        for i, r in enumerate(recs):
            k = str(i)
            assert len(log["perturb_loss"][k]) == len(log["num_token_perturb"][k]) == len(r["perturbed_answer"])
            assert math.isclose(log["avg_gt_loss"][k], log["gt_loss"][k] / log["num_token_gt"][k])
            assert [
                math.isclose(a, s / n)
                for a, s, n in zip(log["average_perturb_loss"][k], log["perturb_loss"][k], log["num_token_perturb"][k])
            ] == [True] * len(r["perturbed_answer"])
            assert 0.0 <= log["rougeL_recall"][k] <= 1.0 and 0.0 <= log["rouge1_recall"][k] <= 1.0
            prompt, gen, answer = log["generated_text"][k]
            assert prompt == TPL.prompt(r["question"]) and answer == r["answer"] and isinstance(gen, str)
            if "paraphrased_answer" not in r:  # real authors / world facts: paraphrase = answer
                assert log["avg_paraphrased_loss"][k] == log["avg_gt_loss"][k]
    forget = logs["eval_log_forget.json"]
    assert forget["avg_paraphrased_loss"]["0"] != forget["avg_gt_loss"]["0"]
    # the same set evaluated alone gives the same numbers (batching across sets changes nothing)
    alone = evaluate_set(
        model, tok, TPL, eval_sets["world_facts"], EvalConfig(batch_size=3, max_new_tokens=8), paraphrased=False
    )
    for k, v in alone["avg_gt_loss"].items():
        assert math.isclose(v, logs["eval_real_world_wo_options.json"]["avg_gt_loss"][k], rel_tol=1e-5)
    write_json(tmp_path / "log.json", logs)
    assert json.loads((tmp_path / "log.json").read_text())["eval_log.json"]["num_token_gt"]["0"] > 0
    with pytest.raises(ValueError, match="unknown eval set"):
        evaluate_log(model, tok, TPL, {"holdout": []}, EvalConfig())
    # a set whose format has paraphrases (forget, retain) has no fallback for a missing one
    no_para = [{k: v for k, v in eval_sets["forget"][0].items() if k != "paraphrased_answer"}]
    with pytest.raises(ValueError, match="^eval forget: record 0 has no paraphrased_answer$"):
        evaluate_log(model, tok, TPL, {"forget": no_para}, EvalConfig())


def test_a_length_cap_logs_how_many_sequences_it_cut_and_no_cap_cuts_none(tok_model, eval_sets, caplog):
    """EvalConfig.max_length: None (the default) scores every sequence whole; a cap's cuts are counted in the log."""
    import logging

    tok, model = tok_model
    pairs = _pairs(eval_sets)
    whole = answer_losses(model, tok, TPL, pairs, EvalConfig(batch_size=16))
    full_n = [len(tok(TPL.answer_text(a), add_special_tokens=False)["input_ids"]) + 1 for _, a in pairs]
    assert [n for _, n in whole] == full_n  # every answer token and the EOS scored
    lengths = sorted(len(tok(TPL.prompt(q) + TPL.answer_text(a))["input_ids"]) for q, a in pairs)
    cap = lengths[len(pairs) // 2]  # the median sequence: some pairs are cut, some are not
    with caplog.at_level(logging.INFO, logger="qrerase.evaluation"):
        capped = answer_losses(model, tok, TPL, pairs, EvalConfig(batch_size=16, max_length=cap))
    cut = sum(c < n for (_, c), n in zip(capped, full_n))
    assert 0 < cut < len(pairs)
    assert f"answer losses: {cut} of {len(pairs)} sequences cut at max_length {cap}" in caplog.text
