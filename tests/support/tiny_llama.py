"""A tiny real transformers Llama and random PEFT LoRA adapters for it (no downloads)."""

from __future__ import annotations

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
    max_position_embeddings=64,
)


def build_tiny_llama(seed: int = 0):
    """A randomly initialised float32 ``LlamaForCausalLM`` (hidden 64, 2 layers, vocab 128), eval mode."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA))
    return model.eval()


def save_random_lora(out_dir, seed: int = 1, **lora_kwargs):
    """Save a PEFT LoRA adapter for ``build_tiny_llama()`` with random (non-zero) lora_A and lora_B.

    Returns (out_dir, delta) where delta maps module name → PEFT's own merged delta
    (``merge_and_unload()`` weight minus base weight) as a float64 numpy array.
    """
    import torch
    from peft import LoraConfig, get_peft_model

    kwargs = dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    kwargs.update(lora_kwargs)
    base = build_tiny_llama(0)
    before = {n: p.detach().clone() for n, p in base.state_dict().items()}
    peft_model = get_peft_model(base, LoraConfig(**kwargs))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    peft_model.save_pretrained(str(out_dir))
    merged = peft_model.merge_and_unload()
    delta = {}
    for name, p in merged.state_dict().items():
        d = p.detach().double() - before[name].double()
        if name.endswith(".weight") and d.abs().max() > 0:
            delta[name[: -len(".weight")]] = d.numpy()
    return out_dir, delta
