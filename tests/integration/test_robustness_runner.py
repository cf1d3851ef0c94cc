"""The robustness stage's job (qrerase.robustness.runner / .text / .table) on a real tiny Llama and TOFU rows."""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import pytest
import torch
from support.tiny_text import DATA, TINY, TPL, tofu_qa

from qrerase.io import read_jsonl
from qrerase.robustness.halves import entities_in_blocks, text_halves, with_paraphrases
from qrerase.robustness.prompts import prompt_examples
from qrerase.robustness.quantization import edit_step_ratios, quantize_roundtrip
from qrerase.robustness.runner import orthonormal_basis, run_attacks, subspace_rows
from qrerase.robustness.settings import RobustnessSettings, check_prompt_room, robustness_settings
from qrerase.robustness.table import recovery_frame, subspace_frame, summary_markdown
from qrerase.robustness.text import PromptSetup, attacked_model, entity_facts, linear_weights, text_target
from qrerase.text.evaluation import EvalConfig, answer_losses
from qrerase.text.lm import qa_pair
from qrerase.text.models import build_tiny_llama, train_bpe_tokenizer
from qrerase.text.training import LoraTrainConfig

SETTINGS = RobustnessSettings(
    budgets=(0, 1, 3), lr_factors=(1.0, 0.1), benign_lr_factors=(1.0,), formats=("q8_0", "q4_0")
)


@pytest.fixture(scope="module")
def forget():
    return tofu_qa(0, 40)  # two authors, 20 questions each


@pytest.fixture(scope="module")
def tok(tmp_path_factory, forget):
    rows = forget + tofu_qa(360, 400)
    return train_bpe_tokenizer(
        [f"{r['question']} {r['answer']}" for r in rows], 500, tmp_path_factory.mktemp("tok") / "tok"
    )


def _target(tok, forget, in_a, prompts=None):
    half_b = np.flatnonzero(~in_a)
    scored = {"B": [forget[i] for i in half_b], "forget": forget, "utility": tofu_qa(360, 370)}
    training = {"A": [forget[i] for i in np.flatnonzero(in_a)], "retain": tofu_qa(370, 400)}
    lora = LoraTrainConfig.from_dict(
        {
            "r": 4,
            "alpha": 8,
            "target_modules": ["q_proj", "v_proj"],
            "train": {"epochs": 1, "lr": 1e-3, "batch_size": 1},
        }
    )
    return text_target(
        tok,
        TPL,
        scored,
        training,
        EvalConfig(batch_size=16),
        {"full": (1e-3, 8), "lora": (1e-2, 8)},
        96,
        lora,
        prompts=prompts,
    )


def test_halves_keep_every_author_in_both_and_share_no_question(forget):
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    assert in_a.sum() == 20
    for author in range(2):
        block = in_a[author * 20 : (author + 1) * 20]
        assert block.sum() == 10
    a_questions = {forget[i]["question"] for i in np.flatnonzero(in_a)}
    assert not a_questions & {forget[i]["question"] for i in np.flatnonzero(~in_a)}
    with pytest.raises(ValueError, match="not in blocks of 20"):
        text_halves(forget[:30], 20, seed=0, share=0.5)


def test_run_attacks_scores_every_budget_and_leaves_the_model_unchanged(tok, forget):
    model = build_tiny_llama(TINY, tok, seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    target = _target(tok, forget, in_a)
    ceiling = {n: (w.detach().numpy() + 0.01).astype(np.float32) for n, w in linear_weights(model).items()}
    diag = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"]
    rows, delta = run_attacks(model, target, SETTINGS, seed=0, ceiling=ceiling, diagnostic=diag)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    frame = pd.DataFrame(rows)
    # budget 0 of every training attack is the model as given: the answer NLL of B, by definition
    b_pairs = [qa_pair(forget[i]) for i in np.flatnonzero(~in_a)]
    want = np.mean([s / n for s, n in answer_losses(model, tok, TPL, b_pairs, EvalConfig(batch_size=16))])
    start = frame[(frame["budget"] == 0) & (frame["set"] == "B") & (frame["attack"] != "quantize")]
    assert len(start) == 2 * 2 + 2 * 1  # (relearn: 2 modes x 2 factors) + (benign: 2 modes x 1 factor)
    np.testing.assert_allclose(start["value"], want, rtol=1e-6)
    for (attack, mode, factor), g in frame[frame["attack"] != "quantize"].groupby(["attack", "mode", "lr_factor"]):
        assert sorted(g["budget"].unique()) == [0, 1, 3], (attack, mode, factor)
    # benign fine-tuning is scored on half B, as relearning, and on the whole forget set, at every budget
    benign = frame[frame["attack"] == "benign"]
    for scored in ("B", "forget"):
        assert sorted(benign.loc[benign["set"] == scored, "budget"].unique()) == [0, 1, 3]
    # relearning on A at the full rate lowers B's NLL after 3 steps (the attack learns)
    relearn = frame[
        (frame["attack"] == "relearn") & (frame["mode"] == "full") & (frame["lr_factor"] == 1.0) & (frame["set"] == "B")
    ]
    assert relearn[relearn["budget"] == 3]["value"].iloc[0] < relearn[relearn["budget"] == 0]["value"].iloc[0]
    # quantization: the scored model is the gguf round trip of every linear weight
    q = copy.deepcopy(model)
    with torch.no_grad():
        for w in linear_weights(q).values():
            if w.shape[1] % 32 == 0:  # the runner keeps the others in float, as llama.cpp cannot block them
                w.copy_(torch.from_numpy(quantize_roundtrip(w.numpy(), "q4_0")))
    got = frame[(frame["attack"] == "quantize") & (frame["format"] == "q4_0") & (frame["set"] == "forget")][
        "value"
    ].iloc[0]
    want_q = np.mean(
        [s / n for s, n in answer_losses(q, tok, TPL, [qa_pair(r) for r in forget], EvalConfig(batch_size=16))]
    )
    assert got == pytest.approx(want_q, rel=1e-6)
    # the edit-to-step ratio compares the unquantized weights with the ceiling's, pooled over the quantized modules
    blocked = {n: w.detach().numpy() for n, w in linear_weights(model).items() if w.shape[1] % 32 == 0}
    want_r = np.median(np.concatenate([edit_step_ratios(w, ceiling[n], "q4_0") for n, w in blocked.items()]))
    got_r = frame[(frame["attack"] == "quantize") & (frame["format"] == "q4_0") & (frame["set"] == "weights")]["value"]
    assert got_r.iloc[0] == pytest.approx(want_r, rel=1e-9)
    # the diagnostic's update: full relearning at lr x1 after 3 steps, on the named modules only
    assert sorted(delta) == sorted(diag) and all(np.abs(d).max() > 0 for d in delta.values())
    sub = pd.DataFrame(
        subspace_rows(delta, {"task": {diag[0]: orthonormal_basis(np.eye(48)[:, :2] * 3.0)}}, k=2, seed=0)
    )
    assert set(sub["subspace"]) == {"task", "random"} and sub["share"].between(0, 1).all()


def test_an_erase_adapter_is_attacked_as_its_merged_weights(tok, forget, tmp_path):
    """An unlearned model shipped as an erase adapter (``erase.outputs: [adapter]``): PEFT loads the base
    weights frozen, and merging keeps them so. The attacked model is the merged weights with every
    parameter trainable, so a full-parameter attack trains (it stopped with "model has no trainable
    parameters" on the real-model run), and it scores what the merged checkpoint scores."""
    from peft import LoraConfig, PeftModel, get_peft_model

    base = build_tiny_llama(TINY, tok, seed=1)
    edit = get_peft_model(copy.deepcopy(base), LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for n, w in edit.named_parameters():
            if "lora_B" in n:
                w.normal_(0, 0.05)
    edit.save_pretrained(tmp_path / "adapter")
    loaded = PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / "adapter"))
    assert not any(p.requires_grad for p in loaded.merge_and_unload().parameters())
    model = attacked_model(PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path / "adapter")))
    assert not hasattr(model, "merge_and_unload") and all(p.requires_grad for p in model.parameters())
    merged = edit.merge_and_unload()
    for k, v in merged.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    settings = RobustnessSettings(budgets=(0, 2), lr_factors=(1.0,), modes=("full",), formats=())
    rows, _ = run_attacks(model, _target(tok, forget, in_a), settings, seed=0)
    relearn = pd.DataFrame(rows).query("attack == 'relearn' and set == 'B'").set_index("budget")["value"]
    assert relearn[2] < relearn[0]


def test_table_scales_by_floor_and_ceiling_under_the_same_attack():
    rows = []
    for model, b0, b4 in (("base", 1.0, 0.8), ("retain", 3.0, 2.0), ("m", 2.5, 1.0)):
        for budget, v in ((0, b0), (4, b4)):
            rows += [
                {
                    "model": model,
                    "attack": "relearn",
                    "mode": "full",
                    "lr_factor": 1.0,
                    "lr": 1e-3,
                    "budget": budget,
                    "format": "",
                    "set": s,
                    "value": x,
                }
                for s, x in (("B", v), ("forget", v), ("utility", 0.5))
            ]
        rows += [
            {
                "model": model,
                "attack": "quantize",
                "mode": "",
                "lr_factor": 1.0,
                "lr": 0.0,
                "budget": 0,
                "format": "q4_0",
                "set": s,
                "value": x,
            }
            for s, x in (("forget", b0 - 0.3), ("utility", 0.6), ("weights", 0.7))
        ]
    frame = recovery_frame(pd.DataFrame(rows), "base", "retain", ["base", "retain", "m"])
    rel = frame[frame["attack"] == "relearn"].set_index(["model", "budget"])
    assert rel.loc[("base", 0), "recovery"] == 1 and rel.loc[("retain", 4), "recovery"] == 0
    assert rel.loc[("m", 0), "recovery"] == pytest.approx((2.5 - 3.0) / (1.0 - 3.0))
    assert rel.loc[("m", 4), "recovery"] == pytest.approx((1.0 - 2.0) / (0.8 - 2.0))
    assert rel.loc[("m", 4), "gain"] == pytest.approx((1.0 - 2.0) / (0.8 - 2.0) - 0.25)
    q = frame[frame["attack"] == "quantize"].set_index("model")
    # scaled by the floor and ceiling through the same round trip: (2.2 - 2.7) / (0.7 - 2.7)
    assert q.loc["m", "recovery"] == pytest.approx((2.2 - 2.7) / (0.7 - 2.7))
    assert (q.loc["base", "recovery"], q.loc["retain", "recovery"]) == (1.0, 0.0)
    # the unscaled share of m's own forgetting undone, (s_q - s_unlearned) / (s_fine-tuned - s_unlearned)
    assert q.loc["m", "forgetting_undone"] == pytest.approx((2.2 - 2.5) / (1.0 - 2.5))
    assert q.loc["m", "shift"] == pytest.approx(-0.3) and np.isnan(q.loc["base", "forgetting_undone"])
    assert not frame["overshoot"].astype(bool).any()
    assert "| m |" in summary_markdown(frame, ["base", "retain", "m"], {}, "answer NLL")
    # a model whose forgetting went past the floor (B NLL 4.0 > the floor's 3.0): flagged on every row
    past = pd.DataFrame(rows)
    past.loc[(past["model"] == "m") & (past["set"].isin(["B", "forget"])) & (past["budget"] == 0), "value"] = 4.0
    over = recovery_frame(past, "base", "retain", ["base", "retain", "m"])
    assert over.loc[over["model"] == "m", "overshoot"].astype(bool).all()
    assert not over.loc[over["model"] != "m", "overshoot"].astype(bool).any()
    assert over.loc[(over["model"] == "m") & (over["budget"] == 0) & (over["set"] == "B"), "statistic"].iloc[0] == 4.0
    assert "| m (overshoot: past the floor) |" in summary_markdown(over, ["base", "retain", "m"], {}, "answer NLL")
    # an attack that brings the floor to the ceiling: the recovery is undefined there (empty, gap 0), the rest stands
    same = pd.DataFrame(rows)
    at4 = (same["budget"] == 4) & (same["attack"] == "relearn")
    same.loc[at4 & (same["model"] == "retain"), "value"] = same.loc[at4 & (same["model"] == "base"), "value"].to_numpy()
    tied = recovery_frame(same, "base", "retain", ["base", "retain", "m"])
    tied = tied[tied["attack"] == "relearn"].set_index(["model", "budget", "set"])
    assert tied.loc[("m", 4, "B"), "gap"] == 0 and np.isnan(tied.loc[("m", 4, "B"), "recovery"])
    assert tied.loc[("m", 0, "B"), "recovery"] == pytest.approx(0.25)


def test_subspace_frame_reports_the_ratio_to_random():
    sub = pd.DataFrame(
        [
            {"model": "m", "module": "a", "subspace": "erased", "k": 2, "d_out": 8, "share": 0.5},
            {"model": "m", "module": "a", "subspace": "random", "k": 2, "d_out": 8, "share": 0.25},
        ]
    )
    t = subspace_frame(sub, ["m"]).set_index("subspace")
    assert t.loc["erased", "x_random"] == pytest.approx(2.0) and t.loc["random", "k_over_d_out"] == 0.25


@pytest.mark.parametrize(
    "section,key",
    [
        ({"budgets": [0, -1]}, "robustness.budgets"),
        ({"budgets": [1, 2]}, "robustness.budgets"),
        ({"formats": ["q3_k"]}, "robustness.formats"),
        ({"a_share": 1.0}, "robustness.a_share"),
        ({"a_share": 0}, "robustness.a_share"),
        ({"modes": ["qlora"]}, "robustness.modes"),
        ({"lr_factors": [0]}, "robustness.lr_factors"),
    ],
)
def test_bad_settings_name_their_key(section, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        robustness_settings(section)


def test_the_bitsandbytes_formats_are_attacked_like_the_gguf_ones(tok, forget):
    pytest.importorskip("bitsandbytes", reason='bitsandbytes (the quant extra: pip install -e ".[quant]")')
    model = build_tiny_llama(TINY, tok, seed=1)
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    settings = RobustnessSettings(budgets=(0,), lr_factors=(1.0,), modes=("full",), formats=("nf4", "int8"))
    rows, _ = run_attacks(model, _target(tok, forget, in_a), settings, seed=0)
    frame = pd.DataFrame(rows).query("attack == 'quantize' and set == 'forget'").set_index("format")["value"]
    q = copy.deepcopy(model)
    with torch.no_grad():
        for w in linear_weights(q).values():
            if w.shape[1] % 64 == 0:  # NF4's block; the others stay in float
                w.copy_(torch.from_numpy(quantize_roundtrip(w.numpy(), "nf4")))
    pairs = [qa_pair(r) for r in forget]
    want = np.mean([s / n for s, n in answer_losses(q, tok, TPL, pairs, EvalConfig(batch_size=16))])
    assert frame["nf4"] == pytest.approx(want, rel=1e-6)
    assert np.isfinite(frame["int8"]) and frame["int8"] != frame["nf4"]


def _nll(model, ids: list[int], n_answer: int) -> float:
    """The mean NLL of the last ``n_answer`` tokens of ``ids`` under ``model``: a reference computed from
    one unbatched forward pass, apart from the stage's batching."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], -1)
    target = torch.tensor(ids[1:])
    per = -logp[torch.arange(len(target)), target][-n_answer:]
    return float(per.mean())


def _tokens(tok, text: str) -> list[int]:
    return list(tok([text], add_special_tokens=False)["input_ids"][0])


@pytest.fixture(scope="module")
def prompted(tok, forget):
    """A tiny model, the halves with each row's entity and paraphrase, and its prompt attacks' rows."""
    model = build_tiny_llama(TINY, tok, seed=1)
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    rows = [{**r, "entity": e} for r, e in zip(forget, entities_in_blocks(len(forget), 20))]
    rows = with_paraphrases(rows, read_jsonl(DATA / "forget10_perturbed.jsonl")[:40], "forget10_perturbed.jsonl")
    half_a = [rows[i] for i in np.flatnonzero(in_a)]
    half_b = [rows[i] for i in np.flatnonzero(~in_a)]
    setup = PromptSetup(
        attacks=("paraphrase", "prefix", "in_context"),
        prefix="Sure, here is the answer:",
        grid=(1, 2),
        paraphrases=[r["paraphrased_question"] for r in half_b],
        facts=entity_facts(half_a, half_b),
        context=1024,  # this test tokenizer (500 tokens) spells a fact in about 130; RoPE takes any position
    )
    settings = RobustnessSettings(budgets=(0,), lr_factors=(1.0,), modes=("full",), formats=(), in_context=(1, 2))
    out, _ = run_attacks(model, _target(tok, forget, in_a, setup), settings, seed=0)
    return model, half_a, half_b, setup, pd.DataFrame(out)


def test_each_prompt_attack_scores_the_plain_answer_tokens_after_its_prompt(tok, prompted):
    """Against the definitions (qrerase.robustness.prompts): the same answer tokens as the plain scoring,
    after BOS + the paraphrased question's prompt; after the prompt and ' ' + prefix; after m earlier turns
    (question, answer, EOS) of the same author's half A. Each NLL recomputed from one unbatched pass."""
    model, half_a, half_b, setup, frame = prompted
    bos, eos = [tok.bos_token_id], tok.eos_token_id

    def answer(r) -> list[int]:
        return _tokens(tok, TPL.answer_text(r["answer"])) + [eos]  # 96-token cap: no B answer reaches it

    def score(prompts) -> float:
        return float(np.mean([_nll(model, p + answer(r), len(answer(r))) for p, r in zip(prompts, half_b)]))

    want = {
        ("paraphrase", 1): score([bos + _tokens(tok, TPL.prompt(r["paraphrased_question"])) for r in half_b]),
        ("prefix", 1): score(
            [bos + _tokens(tok, TPL.prompt(r["question"])) + _tokens(tok, " " + setup.prefix) for r in half_b]
        ),
    }
    for m in (1, 2):
        prompts = []
        for r in half_b:
            shown = [a for a in half_a if a["entity"] == r["entity"]][:m]
            turns = [t for a in shown for t in _tokens(tok, TPL.prompt(a["question"])) + answer(a)]
            prompts.append(bos + turns + _tokens(tok, TPL.prompt(r["question"])))
        want[("in_context", m)] = score(prompts)
    plain = frame[(frame["attack"] == "relearn") & (frame["budget"] == 0) & (frame["set"] == "B")]["value"].iloc[0]
    assert plain == pytest.approx(score([bos + _tokens(tok, TPL.prompt(r["question"])) for r in half_b]), rel=1e-5)
    for (attack, budget), value in want.items():
        got = frame[(frame["attack"] == attack) & (frame["budget"] == budget) & (frame["set"] == "B")]["value"]
        assert got.iloc[0] == pytest.approx(value, rel=1e-5), (attack, budget)
        assert value != pytest.approx(plain, rel=1e-4), (attack, budget)  # the prompt changed the statistic
        # budget 0: the plain prompt; utility: the model's own (a prompt changes no weight)
        zero = frame[(frame["attack"] == attack) & (frame["budget"] == 0)].set_index("set")["value"]
        assert zero["B"] == plain
        util = frame[(frame["attack"] == attack) & (frame["set"] == "utility")]["value"]
        assert (util == zero["utility"]).all()


def test_prompt_attacks_beyond_the_data_are_refused_and_beyond_the_context_not_run(tok, forget, prompted, caplog):
    """Before any attack runs: an m beyond an entity's facts in half A is refused; an attack whose prompts do
    not all fit the model's context is not run, with a warning naming the key (the other attacks run)."""
    _, half_a, half_b, setup, _ = prompted
    in_a = text_halves(forget, 20, seed=0, share=0.5)
    assert _target(tok, forget, in_a, setup).prompt_runs == (
        ("paraphrase", 1),
        ("prefix", 1),
        ("in_context", 1),
        ("in_context", 2),
    )
    pairs = [qa_pair(r) for r in half_b]
    one = prompt_examples(tok, TPL, pairs, None, "in_context", facts=[f[:1] for f in setup.facts])
    fits_one = max(len(e[0]) for e in one)  # a context that holds every m = 1 prompt, so no m = 2 one
    with caplog.at_level("WARNING", logger="qrerase.robustness"):
        short = _target(tok, forget, in_a, PromptSetup(**{**setup.__dict__, "context": fits_one}))
    assert ("in_context", 2) not in short.prompt_runs and ("prefix", 1) in short.prompt_runs
    assert "in_context at 2 not run: its prompts reach" in caplog.text and "(robustness.in_context)" in caplog.text
    many = PromptSetup(**{**setup.__dict__, "grid": (11,)})
    with pytest.raises(ValueError, match=r"robustness\.in_context': m = 11, but an entity has 10 fact"):
        _target(tok, forget, in_a, many)
    bare = PromptSetup(**{**setup.__dict__, "paraphrases": None})
    with pytest.raises(ValueError, match=r"robustness\.prompt_attacks: paraphrase"):
        _target(tok, forget, in_a, bare)
    with pytest.raises(ValueError, match="forget10.jsonl: no paraphrased_question"):
        with_paraphrases(forget[:2], [], "forget10.jsonl")


@pytest.mark.parametrize(
    "section,key",
    [
        ({"prompt_attacks": ["jailbreak"]}, "robustness.prompt_attacks"),
        ({"in_context": [0, 1]}, "robustness.in_context"),
        ({"in_context": [1.5]}, "robustness.in_context"),
        ({"prefix": " "}, "robustness.prefix"),
        ({"optional_formats": ["q2_k"]}, "robustness.optional_formats"),
    ],
)
def test_bad_prompt_settings_name_their_key(section, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        robustness_settings(section)


def test_the_planning_bounds_of_the_prompt_attacks():
    """m at most an entity's facts in half A, ceil(block x a_share); a prefix of more words than the
    context holds beside BOS and EOS (each word at least one token); unknown bounds: not checked here."""
    s = robustness_settings({"in_context": [1, 10], "prefix": " ".join(["sure"] * 254)})
    check_prompt_room(s, "tofu", 20, 256)  # 10 facts per author in A; 254 words + BOS + EOS fit 256
    with pytest.raises(ValueError, match=r"robustness\.in_context': expected m <= 6 on track tofu.*got 10"):
        check_prompt_room(robustness_settings({"in_context": [10], "a_share": 0.3}), "tofu", 20, None)
    with pytest.raises(ValueError, match=r"robustness\.prefix': expected a prefix that fits .* 255 words"):
        check_prompt_room(robustness_settings({"prefix": " ".join(["sure"] * 255)}), "tofu", 20, 256)
    check_prompt_room(robustness_settings({"prefix": "x " * 500}), "task_level", None, None)  # the job checks
    check_prompt_room(robustness_settings({"prompt_attacks": [], "in_context": [50]}), "tofu", 20, 10)


def test_the_table_scales_prompt_attacks_like_relearning_and_summarises_them():
    rows = []

    def add(model, attack, budget, fmt_sets):
        rows.extend(
            {
                "model": model,
                "attack": attack,
                "mode": "full" if attack == "relearn" else "",
                "lr_factor": 1.0,
                "lr": 0.0,
                "budget": budget,
                "format": "",
                "set": s,
                "value": v,
            }
            for s, v in fmt_sets
        )

    for model, plain, para, m2 in (("base", 1.0, 1.2, 0.9), ("retain", 3.0, 3.1, 2.5), ("m", 2.5, 2.0, 1.5)):
        add(model, "relearn", 0, [("B", plain), ("forget", plain), ("utility", 0.5)])
        add(model, "paraphrase", 0, [("B", plain), ("utility", 0.5)])
        add(model, "paraphrase", 1, [("B", para), ("utility", 0.5)])
        add(model, "in_context", 0, [("B", plain), ("utility", 0.5)])
        add(model, "in_context", 2, [("B", m2), ("utility", 0.5)])
    frame = recovery_frame(pd.DataFrame(rows), "base", "retain", ["base", "retain", "m"])
    f = frame.set_index(["model", "attack", "budget"])
    assert f.loc[("m", "paraphrase", 1), "recovery"] == pytest.approx((2.0 - 3.1) / (1.2 - 3.1))
    assert f.loc[("m", "in_context", 2), "recovery"] == pytest.approx((1.5 - 2.5) / (0.9 - 2.5))
    assert f.loc[("m", "in_context", 2), "gain"] == pytest.approx((1.5 - 2.5) / (0.9 - 2.5) - 0.25)
    md = summary_markdown(frame, ["base", "retain", "m"], {}, "answer NLL")
    assert "| paraphrase | in_context m=2 |" in md
    assert f"| {(2.0 - 3.1) / (1.2 - 3.1):.3f} | {(1.5 - 2.5) / (0.9 - 2.5):.3f} |" in md


def test_the_diagnostic_averages_every_row_over_the_methods_modules_with_the_retain_and_ceiling_rows():
    """An LL method edits module a only: its task, retain and random rows average module a as its erased
    row does (module b's rows are left out); the ceiling row is the ceiling's update in the method's span."""

    def row(model, module, subspace, share, k=2):
        return {"model": model, "module": module, "subspace": subspace, "k": k, "d_out": 8, "share": share}

    sub = pd.DataFrame(
        [
            row("m_rule", "a", "erased", 0.6),
            row("m_rule", "a", "task", 0.4),
            row("m_rule", "b", "task", 0.9),
            row("m_rule", "a", "retain", 0.1),
            row("m_rule", "b", "retain", 0.7),
            row("m_rule", "a", "random", 0.2),
            row("m_rule", "b", "random", 0.3),
            row("base", "a", "erased:m", 0.3),
            row("base", "b", "erased:m", 0.8),
            row("base", "a", "random", 0.25),
            row("base", "b", "random", 0.35),
            row("base", "a", "task", 0.5),
            row("base", "b", "task", 0.7),
        ]
    )
    t = subspace_frame(sub, ["base", "m_rule"], "base", {"m_rule": "m"}).set_index(["model", "subspace"])
    mine = t.loc["m_rule"]
    assert list(mine.index) == ["erased", "ceiling", "task", "retain", "random"]
    assert (mine["modules"] == 1).all()
    assert mine.loc["task", "mean_share"] == 0.4 and mine.loc["retain", "mean_share"] == 0.1
    assert mine.loc["erased", "x_random"] == pytest.approx(0.6 / 0.2)
    assert mine.loc["ceiling", "mean_share"] == 0.3 and mine.loc["ceiling", "x_random"] == pytest.approx(0.3 / 0.25)
    # a model with no erased rows averages every module
    assert t.loc[("base", "task"), "modules"] == 2 and t.loc[("base", "task"), "mean_share"] == pytest.approx(0.6)


def test_optional_formats_run_where_their_package_is_installed():
    """robustness.optional_formats (config.yaml: nf4, int8): after the required formats where bitsandbytes
    is installed, skipped where it is not; a required one without its package is refused."""
    import importlib.util

    from qrerase.robustness.quantization import missing_backend

    s = robustness_settings({"formats": ["q4_0"], "optional_formats": ["nf4", "q4_0", "int8"]})
    have = importlib.util.find_spec("bitsandbytes") is not None
    assert s.quantized == (("q4_0", "nf4", "int8") if have else ("q4_0",))
    assert (missing_backend("nf4") is None) == have
    if not have:
        with pytest.raises(ValueError, match=r"robustness\.formats.*bitsandbytes"):
            robustness_settings({"formats": ["nf4"]})
