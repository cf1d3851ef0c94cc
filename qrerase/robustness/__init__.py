"""Is the knowledge gone, or only hidden? The measures of the robustness stage (docs/robustness.md):
recovery under relearning, benign fine-tuning and quantization, and the share of an attack's update that
falls in the erased subspace. Numpy, the ``gguf`` package's quantizers and bitsandbytes' (imported, with
torch, only for its formats).

The stage's rules: rules/studies/robustness.smk; the protocol, the hypotheses and the results:
docs/robustness.md.
"""

from .measures import quantization_recovery, random_subspace, recovery, relearning_gain, split_halves, subspace_share
from .quantization import FORMATS, block_steps, edit_step_ratio, edit_step_ratios, quantize_roundtrip, zero_steps

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
    "edit_step_ratios",
    "zero_steps",
]
