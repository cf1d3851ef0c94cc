"""A training job for tests/integration/test_engine_multiprocess.py and test_engine_placement.py: run by
``accelerate launch`` / ``torchrun`` with several gloo workers on the CPU, or by plain ``python`` as the
one-process reference.

usage: dist_worker.py KIND BACKEND TOKENIZER_DIR OUT.safetensors [MODEL_DIR]

KIND: finetune | lora | npo | npo-lora | kl (the engine's training runs; npo-lora: NPO in LoRA mode),
memory (a fine-tune that measures the rank's peak resident memory during training and during the
end-of-training save) or bf16 (a bf16 fine-tune that records the FSDP2 mixed-precision policy of the
sharded modules).
MODEL_DIR: the model (and a baseline's reference) is loaded from this checkpoint with
``load_model(sharded=...)`` as the workflow scripts do; without it, the tiny model is built in memory.
Rank 0 writes the trained weights (safetensors) and the loss curve (OUT + ".csv"); memory and bf16
write their measurements to OUT + ".rank<R>.json" on every rank.

Resume: with QRERASE_TEST_RESUME_DIR set the run keeps a resumable state after every
optimiser step there (``checkpoint_every: 1``, :func:`qrerase.engine.resuming`) and rank 0 writes the
process group's timeout in minutes to OUT + ".timeout" (``dist_timeout_min``: 7); with
QRERASE_TEST_EXIT_AFTER=K too every rank exits (status 17, no cleanup: a crash) right after the state of
step K is complete.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys

import torch
from safetensors.torch import save_file

from qrerase import engine
from qrerase.engine import accelerator
from qrerase.text.lm import PromptTemplate
from qrerase.text.models import build_tiny_llama, load_model, load_tokenizer
from qrerase.text.training import LoraTrainConfig, TrainConfig, train_causal_lm, train_lora
from support.tiny_text import TINY, tofu_qa

RANK = int(os.environ.get("RANK", "0"))


def name_process() -> None:
    """Name this process (and so every thread it starts from now on) ``rank<R>``: strace ``-Y`` then
    tells which rank opened a file, whichever thread of it did."""
    libc = ctypes.CDLL(None)
    libc.prctl(15, f"rank{RANK}".encode(), 0, 0, 0)  # PR_SET_NAME


def peak_kib() -> int:
    """This process's peak resident set size since the last :func:`reset_peak` (VmHWM, KiB)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))


def reset_peak() -> None:
    """Reset the kernel's peak resident set size of this process to its current size (clear_refs 5)."""
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")


def memory_run(tok, records, cfg, out: str) -> None:
    """A fine-tune of a deep narrow Llama (many tensors, none large): the peak RSS of training (reset
    after loading, read at the last optimiser step) and of what follows (freeing the optimiser,
    gathering, rank 0's write), with the size of the largest tensor."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from qrerase.engine import train_steps
    from qrerase.models.checkpoints import save_model
    from qrerase.text.lm import answer_token_nll, collate, encode_qa_many, pad_token_id, qa_pair
    from qrerase.text.losses import token_mean_split
    from qrerase.text.training import epoch_steps

    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=16,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(9)
    model = LlamaForCausalLM(config).eval()
    largest = max(t.numel() * t.element_size() for t in model.state_dict().values())
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    pad = pad_token_id(tok)
    examples = encode_qa_many(tok, PromptTemplate(), [qa_pair(r) for r in records], 32)
    steps = epoch_steps([len(x[0]) for x in examples], cfg.batch_size, 1, cfg.seed)[:3]

    def loss_fn(idx):
        nll, _ = answer_token_nll(model, collate([examples[i] for i in idx], pad))
        return nll.mean(), {}

    peaks = {}

    def stop(step):
        if step == len(steps):  # after the last update: every training allocation has happened
            peaks["train"] = peak_kib()
            reset_peak()
        return False

    reset_peak()
    train_steps(model, cfg, steps, loss_fn, desc="mem", stop=stop, split=token_mean_split(model, examples, pad))
    if RANK == 0:
        save_model(model, tok, out + ".model")
    peaks["save"] = peak_kib()
    with open(f"{out}.rank{RANK}.json", "w", encoding="utf-8") as f:
        json.dump({**peaks, "largest_tensor": largest, "model_bytes": total}, f)


def bf16_run(tok, records, cfg, out: str) -> None:
    """A bf16 fine-tune: at the first step, the mixed-precision policy FSDP2 holds for every sharded
    module's parameter group, and the dtype of a layer's weight as its forward pass sees it."""
    from qrerase.engine import train_steps
    from qrerase.text.lm import answer_token_nll, collate, encode_qa_many, pad_token_id, qa_pair
    from qrerase.text.losses import token_mean_split
    from qrerase.text.training import epoch_steps

    model = build_tiny_llama(TINY, tok, seed=9).to(torch.bfloat16)
    pad = pad_token_id(tok)
    examples = encode_qa_many(tok, PromptTemplate(), [qa_pair(r) for r in records], 64)
    steps = epoch_steps([len(x[0]) for x in examples], cfg.batch_size, 1, cfg.seed)[:2]
    seen = {}

    def hook(module, args):
        seen.setdefault("forward_weight_dtype", str(module.weight.dtype))

    handle = model.model.layers[0].self_attn.q_proj.register_forward_pre_hook(hook)

    def loss_fn(idx):
        nll, _ = answer_token_nll(model, collate([examples[i] for i in idx], pad))
        return nll.mean(), {}

    def stop(step):
        if step == 1:
            from torch.distributed.fsdp import FSDPModule

            groups = []
            for name, module in model.named_modules():
                if isinstance(module, FSDPModule):
                    group = module._get_fsdp_state()._fsdp_param_group
                    if group is not None:
                        mp = group.mp_policy
                        groups.append(
                            {
                                "module": name,
                                "param_dtype": str(mp.param_dtype),
                                "reduce_dtype": str(mp.reduce_dtype),
                                "sharded_dtype": str(group.fsdp_params[0].sharded_param.dtype),
                            }
                        )
            seen["groups"] = groups
        return False

    train_steps(model, cfg, steps, loss_fn, desc="bf16", stop=stop, split=token_mean_split(model, examples, pad))
    handle.remove()
    seen["saved_dtype"] = str(next(model.parameters()).dtype)
    with open(f"{out}.rank{RANK}.json", "w", encoding="utf-8") as f:
        json.dump(seen, f)


def crash_after(step: int) -> None:
    """Make every rank exit (status 17, no cleanup) right after the resume state of ``step`` is complete."""
    save = accelerator.save_state

    def save_then_exit(accelerator, resume, at):
        save(accelerator, resume, at)
        if at == step:
            sys.stderr.flush()
            os._exit(17)

    accelerator.save_state = save_then_exit  # train_steps calls the engine's functions through this module


def process_group_timeout_min() -> float:
    """The default process group's timeout in minutes, as its (gloo) backend holds it."""
    import torch.distributed as dist

    return dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds() / 60


def check_prelude_frees_its_models() -> None:
    """Wrap :func:`qrerase.engine.accelerator.run_prelude` (which train_steps calls) to check that, under FSDP2,
    every sharded parameter (DTensor, which holds the rank's shard) of the models only the prelude
    evaluates (NPO's π_ref) is freed once it returns, and that those models are left on the meta device."""
    import gc
    import weakref

    run = accelerator.run_prelude

    def checked(prelude, root, unit, models, device, fsdp):
        shards = [weakref.ref(p) for p in unit.parameters()] if unit is not None else []  # DTensors: the shards
        run(prelude, root, unit, models, device, fsdp)
        gc.collect()
        alive = sum(ref() is not None for ref in shards)
        assert alive == 0, f"{alive} of {len(shards)} prelude shards still alive"
        assert all(p.device.type == "meta" for m in models for p in m.parameters())

    accelerator.run_prelude = checked  # train_steps calls the engine's functions through this module


def main(kind: str, backend: str, tok_dir: str, out: str, model_dir: str | None = None) -> None:
    name_process()
    resume_dir = os.environ.get("QRERASE_TEST_RESUME_DIR")
    if not resume_dir:
        return train(kind, backend, tok_dir, out, model_dir, {})
    import logging

    logging.basicConfig(level=logging.INFO, format=f"rank{RANK} %(message)s")
    if os.environ.get("QRERASE_TEST_EXIT_AFTER"):
        crash_after(int(os.environ["QRERASE_TEST_EXIT_AFTER"]))
    with engine.resuming(resume_dir):
        train(kind, backend, tok_dir, out, model_dir, {"checkpoint_every": 1, "dist_timeout_min": 7})
    if RANK == 0:
        with open(out + ".timeout", "w", encoding="utf-8") as f:
            f.write(str(process_group_timeout_min()))


def train(kind: str, backend: str, tok_dir: str, out: str, model_dir: str | None, keys: dict) -> None:
    """One training run of ``kind``; ``keys``: extra engine keys of its training config."""
    records = tofu_qa(360, 400)
    tok = load_tokenizer(tok_dir)
    cfg = TrainConfig(epochs=2, lr=3e-3, batch_size=8, micro_batch_size=2, seed=9, threads=1, backend=backend, **keys)
    if kind == "memory":
        return memory_run(tok, records, cfg, out)
    if kind == "bf16":
        return bf16_run(tok, records, cfg, out)
    bcfg = None
    if kind in ("npo", "npo-lora", "kl"):
        from qrerase.baselines.text import TextBaselineConfig, loads_sharded

        method, _, lora = kind.partition("-")
        mode = {"mode": "lora", "lora_r": 4} if lora else {}
        bcfg = TextBaselineConfig.of(
            method=method,
            epochs=2,
            lr=1e-3,
            batch_size=8,
            micro_batch_size=2,
            seed=9,
            threads=1,
            backend=backend,
            **keys,
            **mode,
        )
        shard, shard_ref = loads_sharded(bcfg)
    else:
        shard = engine.sharded(backend)
    model = load_model(model_dir, sharded=shard) if model_dir else build_tiny_llama(TINY, tok, seed=9)
    if kind == "finetune":
        frame = train_causal_lm(model, tok, records, PromptTemplate(), cfg, desc="ft")
    elif kind == "lora":
        model, frame = train_lora(model, tok, records, PromptTemplate(), LoraTrainConfig(r=4, train=cfg))
        model = model.merge_and_unload()
    elif kind in ("kga", "ku"):  # task-level baselines (qrerase.tracks.task_level.baselines)
        from qrerase.tracks.task_level.baselines import TaskLevelBaselineConfig, train_kga, train_ku

        hp = {"aux_epochs": 1, "aux_batch_size": 8} if kind == "kga" else {"check_every": 1}
        tcfg = TaskLevelBaselineConfig.from_dict(
            {"method": kind, "epochs": 1, "lr": 1e-3, "batch_size": 8, "micro_batch_size": 2, "seed": 9,
             "threads": 1, "backend": backend, "max_length": 64, **hp, **keys}
        )  # fmt: skip
        forget, retain, new = records[:16], records[16:32], records[32:48]
        if kind == "kga":  # A_f, A_n trained (FSDP2: sharded, then plain again), then frozen in KGA's own run
            initial = build_tiny_llama(TINY, tok, seed=3)
            model, curve = train_kga(model, initial, tok, forget, retain, new, PromptTemplate(), tcfg)
        else:  # its stopping check evaluates the model between steps (FSDP2: inside the wrapped module)
            model, curve, _ = train_ku(model, tok, forget, new, PromptTemplate(), tcfg)
        import pandas as pd

        frame = pd.DataFrame(curve)
    elif bcfg is not None:
        import copy

        import pandas as pd

        from qrerase.baselines.text import train_baseline

        check_prelude_frees_its_models()
        ref = None  # LoRA mode: π_ref is the adapter-disabled model
        if bcfg.mode == "full":
            ref = load_model(model_dir, sharded=shard_ref) if model_dir else copy.deepcopy(model)
        model, curve = train_baseline(model, ref, tok, records[:20], records[20:], PromptTemplate(), bcfg)
        frame = pd.DataFrame(curve)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    write(model, frame, out)


def write(model, frame, out: str) -> None:
    """Rank 0 writes the trained weights (every tensor a plain full one) and the loss curve."""
    if RANK == 0:
        bad = {k: type(t).__name__ for k, t in model.state_dict().items() if type(t) is not torch.Tensor}
        assert not bad, bad
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, out)
        frame.to_csv(out + ".csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:6])
