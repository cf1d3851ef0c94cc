"""A training job for tests/test_engine_multiprocess.py: run by ``accelerate launch`` / ``torchrun``
with several gloo workers on the CPU, or by plain ``python`` as the one-process reference.

usage: dist_worker.py KIND BACKEND TOKENIZER_DIR OUT.safetensors   (KIND: finetune | lora | npo | kl)
Rank 0 writes the trained weights (safetensors) and the loss curve (OUT + ".csv").
"""

from __future__ import annotations

import os
import sys

import torch
from safetensors.torch import save_file
from tiny_text import TINY, tofu_qa

from qrerase.text.lm import PromptTemplate
from qrerase.text.models import build_tiny_llama, load_tokenizer
from qrerase.text.training import LoraTrainConfig, TrainConfig, train_causal_lm, train_lora


def main(kind: str, backend: str, tok_dir: str, out: str) -> None:
    records = tofu_qa(360, 400)
    tok = load_tokenizer(tok_dir)
    cfg = TrainConfig(epochs=2, lr=3e-3, batch_size=8, micro_batch_size=2, seed=9, threads=1, backend=backend)
    model = build_tiny_llama(TINY, tok, seed=9)
    if kind == "finetune":
        frame = train_causal_lm(model, tok, records, PromptTemplate(), cfg, desc="ft")
    elif kind == "lora":
        model, frame = train_lora(model, tok, records, PromptTemplate(), LoraTrainConfig(r=4, train=cfg))
        model = model.merge_and_unload()
    elif kind in ("npo", "kl"):
        import copy

        import pandas as pd

        from qrerase.baselines.text import TextBaselineConfig, train_baseline

        bcfg = TextBaselineConfig(
            method=kind, epochs=2, lr=1e-3, batch_size=8, micro_batch_size=2, seed=9, threads=1, backend=backend
        )
        model, curve = train_baseline(
            model, copy.deepcopy(model), tok, records[:20], records[20:], PromptTemplate(), bcfg
        )
        frame = pd.DataFrame(curve)
    else:
        raise SystemExit(f"unknown kind {kind!r}")
    if int(os.environ.get("RANK", "0")) == 0:
        bad = {k: type(t).__name__ for k, t in model.state_dict().items() if type(t) is not torch.Tensor}
        assert not bad, bad
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, out)
        frame.to_csv(out + ".csv", index=False)


if __name__ == "__main__":
    main(*sys.argv[1:5])
