"""The tiny real text model and TOFU rows shared by the training, engine and baseline tests (no mocks)."""

from __future__ import annotations

from qrerase.io import read_jsonl
from qrerase.text.lm import PromptTemplate
from qrerase.text.models import TinyLlamaConfig
from support import REPO

DATA = REPO / "data" / "tofu"
TINY = TinyLlamaConfig(
    hidden_size=48,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
TPL = PromptTemplate()


def tofu_qa(start: int, stop: int) -> list[dict]:
    """Rows ``start:stop`` of the shipped TOFU forget10 file as question / answer records."""
    rows = read_jsonl(DATA / "forget10.jsonl")[start:stop]
    return [{"question": r["prompt"], "answer": r["response"]} for r in rows]
