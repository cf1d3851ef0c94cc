"""Is the knowledge gone, or only hidden? The measures of the robustness stage (docs/robustness.md):
recovery under relearning, benign fine-tuning and quantization, and the share of an attack's update that
falls in the erased subspace. Numpy and the ``gguf`` package's quantizers; torch-free.

The stage's rules and tables are not built yet: docs/robustness.md states the protocol and the
hypotheses, written before any run.
"""

from .measures import quantization_recovery, random_subspace, recovery, relearning_gain, split_halves, subspace_share
from .quantization import FORMATS, block_steps, edit_step_ratio, quantize_roundtrip

__all__ = [
    "recovery",
    "relearning_gain",
    "quantization_recovery",
    "subspace_share",
    "random_subspace",
    "split_halves",
    "FORMATS",
    "quantize_roundtrip",
    "block_steps",
    "edit_step_ratio",
]
