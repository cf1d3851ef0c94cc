"""RMU, Representation Misdirection for Unlearning (Li et al. 2024, "The WMDP Benchmark: Measuring and
Reducing Malicious Use With Unlearning", ICML 2024, arXiv:2403.03218), as a text baseline.

RMU steers the hidden states of the forget data at one decoder layer ``ℓ`` towards a fixed random
direction, scaled up, and keeps those of the retain data where the frozen model π_ref puts them; only
a few parameters below ``ℓ`` are trained. With ``h_θ,t`` the output of decoder layer ``ℓ`` at token
position ``t`` (``d`` its width), ``u`` a fixed random unit vector (drawn once from a seed: uniform
on ``[0, 1)^d``, normalised, as the reference code) and ``T_i`` the answer token positions of example
``i`` (its ``labels != −100``)::

    mse(a, b)_i = (1/|T_i|) Σ_{t∈T_i} (1/d) ‖a_it − b_it‖²
    L_f = mean_{i∈B_f} mse(h_θ, c·u)_i
    L_r = mean_{j∈B_r} mse(h_θ, h_ref)_j
    L   = L_f + α · L_r

Only the parameters of modules ``update_modules`` (default ``mlp.down_proj``) in decoder layers
``update_layers`` (default ``ℓ−2 … ℓ``) are trained: :class:`RMU` turns ``requires_grad`` off on every
other parameter of the model when it is built, and the engine
(:func:`qrerase.engine.train_steps`) trains exactly the parameters with ``requires_grad``.

Sources. The objective, the control vector, the layer choice (``layer_id 7``, ``layer_ids 5,6,7``,
``param_ids 6`` = ``mlp.down_proj.weight`` of a Llama / Mistral layer), ``steering_coeffs 20`` and
``alpha 100`` are the defaults of the authors' code (centerforaisafety/wmdp, rmu/unlearn.py,
zephyr-7b); the per-example masked mean over answer tokens is open-unlearning's
(src/trainer/unlearn/rmu.py ``compute_activation_loss``; the WMDP code averages over every position of
raw text). open-unlearning's TOFU config (configs/trainer/RMU.yaml) uses ``steering_coeff: 2``,
``alpha: 1``, module ``model.layers.7`` and all parameters trainable, noting that these values depend
on the model and the data; the steering coefficient should be of the order of the norm of the layer's
hidden states.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..hparams import Hparams, hparam
from ..registry import register_method
from .objective import TextObjective

if TYPE_CHECKING:
    import torch

__all__ = ["RmuHparams", "control_vector", "activation_mse", "decoder_layers", "layer_output", "RMU"]


_LAYER_PARAM = re.compile(r"(?:^|\.)layers\.(\d+)\.(.+)$")  # a decoder layer's parameter: index, rest of the name


@dataclass
class RmuHparams(Hparams):
    """RMU (:mod:`qrerase.baselines.rmu`). Defaults: the authors' code (centerforaisafety/wmdp,
    rmu/unlearn.py, zephyr-7b, 32 layers): ``layer_id 7``, ``layer_ids 5,6,7``, ``param_ids 6``
    (``mlp.down_proj``), ``steering_coeffs 20``, ``alpha 100``. ``update_layers`` must be ``<= layer``."""

    layer: int = hparam(7, "l: the 0-based decoder layer whose output is steered (reference 7 of 32)", ge=0)
    update_layers: tuple[int, ...] | None = hparam(
        None,
        "decoder layers whose parameters are trained, each <= layer; null = max(0, layer - 2) ... layer "
        "(reference 5, 6, 7)",
        ge=0,
    )
    update_modules: tuple[str, ...] = hparam(
        ("mlp.down_proj",),
        "module paths inside a decoder layer whose parameters are trained (LoRA adapters of them included); "
        "'*' = every parameter of the layer (reference: mlp.down_proj)",
    )
    steering_coeff: float = hparam(20.0, "c: the scale of the random control vector u (reference 20)", gt=0)
    alpha: float = hparam(100.0, "alpha: the weight of the retain activation MSE (reference 100)", ge=0)
    control_seed: int | None = hparam(None, "the seed of the control vector u; null = the run's seed", ge=0)

    def __post_init__(self):
        super().__post_init__()
        if self.update_layers is not None and max(self.update_layers) > self.layer:
            raise ValueError(
                f"RmuHparams: 'update_layers' must be a non-empty list of integers in [0, layer={self.layer}], "
                f"got {list(self.update_layers)!r}"
            )
        if any(not m.strip(".") for m in self.update_modules):
            raise ValueError(f"RmuHparams: 'update_modules' must be module paths, got {list(self.update_modules)!r}")

    def layers_updated(self) -> tuple[int, ...]:
        """The decoder layers whose parameters are trained (``update_layers`` or ``l-2 ... l``)."""
        if self.update_layers is not None:
            return tuple(sorted(set(self.update_layers)))
        return tuple(range(max(0, self.layer - 2), self.layer + 1))

    def trains(self, name: str) -> bool:
        """Whether parameter ``name`` (as ``model.named_parameters()`` gives it) is one RMU trains: in a
        decoder layer of :meth:`layers_updated`, its name within the layer a path of ``update_modules``
        or under one (``'*'``: any)."""
        m = _LAYER_PARAM.search(name)
        if m is None or int(m.group(1)) not in self.layers_updated():
            return False
        rest = m.group(2)
        return any(p == "*" or rest == p.strip(".") or rest.startswith(p.strip(".") + ".") for p in self.update_modules)


def control_vector(dim: int, seed: int) -> torch.Tensor:
    """RMU's random direction ``u``: ``r / ‖r‖`` with ``r ~ U[0, 1)^dim`` drawn from a CPU generator
    seeded with ``seed``; float32, shape ``(dim,)``, unit Euclidean norm, the same for the same seed."""
    if not (isinstance(dim, int) and dim >= 1):
        raise ValueError(f"control_vector: 'dim' must be an integer >= 1, got {dim!r}")
    if not (isinstance(seed, int) and seed >= 0):
        raise ValueError(f"control_vector: 'seed' must be an integer >= 0, got {seed!r}")
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    r = torch.rand(dim, generator=gen, dtype=torch.float64)
    return (r / r.norm()).float()


def activation_mse(hidden: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example masked MSE ``mse_i = (1/|T_i|) Σ_{t∈T_i} (1/d) ‖hidden_it − target_it‖²``, shape ``(B,)``.

    ``hidden``: ``(B, T, d)`` hidden states; ``target``: the same shape, or ``(d,)`` (one vector for
    every position, e.g. ``c·u``); ``mask``: ``(B, T)`` bool, the positions ``T_i`` scored (each row
    needs at least one). Computed in float32; differentiable in both tensors.
    """
    if hidden.ndim != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(
            f"activation_mse: expected hidden (B, T, d) and mask (B, T), got {tuple(hidden.shape)} and "
            f"{tuple(mask.shape)}"
        )
    if target.shape not in (hidden.shape, hidden.shape[-1:]):
        raise ValueError(f"activation_mse: target shape {tuple(target.shape)} is not {tuple(hidden.shape)} nor (d,)")
    import torch

    mask = mask.to(device=hidden.device, dtype=torch.bool)
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise ValueError("activation_mse: every example needs at least one scored position in 'mask'")
    per_position = (hidden.float() - target.to(hidden.device).float()).pow(2).mean(dim=-1)  # (B, T)
    return (per_position * mask).sum(dim=1) / counts.float()


def _base(model):
    get_base = getattr(model, "get_base_model", None)  # a PEFT wrapper: the model it adapts
    return get_base() if callable(get_base) else model


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layers of a causal LM (``get_decoder().layers``; a PEFT model's base's);
    ``ValueError`` when the model has none."""
    base = _base(model)
    get_decoder = getattr(base, "get_decoder", None)
    layers = getattr(get_decoder(), "layers", None) if callable(get_decoder) else None
    import torch

    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"rmu: {type(base).__name__} has no decoder layer list (get_decoder().layers)")
    return layers


def layer_output(model, batch: Mapping[str, torch.Tensor], layer: int) -> torch.Tensor:
    """The output hidden states ``(B, T, d)`` of decoder layer ``layer`` (0-based) on a batch.

    Runs the model's decoder (not the LM head) on ``input_ids`` / ``attention_mask`` and captures the
    layer's output with a forward hook (as the reference code); differentiable unless called under
    ``torch.no_grad``. The output is that of the layer module itself, so the last layer's is taken
    before the decoder's final norm.
    """
    from ..engine.placement import model_device

    layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise ValueError(f"rmu: 'layer' {layer} is out of range for a model with {len(layers)} decoder layers")
    captured = {}

    def hook(module, args, output):
        if "h" not in captured:
            captured["h"] = output[0] if isinstance(output, tuple) else output

    device = model_device(model)
    handle = layers[layer].register_forward_hook(hook)
    try:
        mask = batch.get("attention_mask")
        _base(model).get_decoder()(
            input_ids=batch["input_ids"].to(device),
            attention_mask=None if mask is None else mask.to(device),
            use_cache=False,
        )
    finally:
        handle.remove()
    return captured["h"]


class RMU(TextObjective):
    """rmu: ``L = L_f + α · L_r`` (``self.hparams``: an
    :class:`RmuHparams`).

    Building it freezes every parameter of ``model`` but those
    :meth:`RmuHparams.trains` selects (a ``ValueError`` when none is selected, or
    when ``layer`` is not a decoder layer of the model) and draws ``u`` (:func:`control_vector`, seeded by
    ``control_seed`` or the run's ``seed``). π_ref is kept frozen during training (in LoRA mode: the
    adapter-disabled model). Both terms are example means: a micro-batch piece contributes its own terms times
    ``|piece| / |batch|``. Logged terms: ``forget_mse`` (``L_f``) and ``retain_mse`` (``L_r``); no
    ``forget_nll`` (the LM head is not run)."""

    needs_retain = True
    needs_reference = True

    def __init__(self, cfg, model, *args, **kwargs):
        super().__init__(cfg, model, *args, **kwargs)
        layers = decoder_layers(model)
        if self.hparams.layer >= len(layers):
            raise ValueError(
                f"rmu: 'layer' {self.hparams.layer} is out of range for a model with {len(layers)} decoder layers"
            )
        self.trained = []
        for name, p in model.named_parameters():
            if p.requires_grad and self.hparams.trains(name):
                self.trained.append(name)
            else:
                p.requires_grad_(False)
        if not self.trained:
            raise ValueError(
                f"rmu: no trainable parameter in layers {list(self.hparams.layers_updated())} matches "
                f"'update_modules' {list(self.hparams.update_modules)}"
            )
        seed = self.hparams.control_seed if self.hparams.control_seed is not None else int(cfg.seed)
        width = getattr(getattr(_base(model), "config", None), "hidden_size", None)
        if not isinstance(width, int):
            raise ValueError(f"rmu: the model's config has no integer 'hidden_size' (got {width!r})")
        self.u = control_vector(width, seed)

    def _hidden(self, model, examples, idx):
        from ..text.lm import collate

        batch = collate([examples[i] for i in idx], self.pad_id)
        return layer_output(model, batch, self.hparams.layer), batch["labels"] != -100

    def _forget(self, idx):
        h, mask = self._hidden(self.model, self.forget_ex, idx)
        return activation_mse(h, self.hparams.steering_coeff * self.u, mask).mean()

    def _retain(self, ridx):
        import torch

        from .text import reference

        with torch.no_grad(), reference(self.ref_model) as ref:
            h_ref, _ = self._hidden(ref, self.retain_ex, ridx)
        h, mask = self._hidden(self.model, self.retain_ex, ridx)
        return activation_mse(h, h_ref.detach(), mask).mean()

    def full(self, payload):
        idx, ridx = payload
        lf, lr = self._forget(idx), self._retain(ridx)
        terms = {"forget_mse": float(lf.detach()), "retain_mse": float(lr.detach())}
        return lf + self.hparams.alpha * lr, terms

    def _piece(self, f, f_live, r, r_live, whole):
        wf, wr = (1.0 if f_live else 0.0), (1.0 if r_live else 0.0)
        lf, lr = self._forget(f), self._retain(r)
        terms = {"forget_mse": float(lf.detach()), "retain_mse": float(lr.detach())}
        loss = lf * (wf * len(f) / whole["n"]) + self.hparams.alpha * lr * (wr * len(r) / whole["n_r"])
        return loss, terms


register_method(
    "rmu",
    label="RMU",
    description="RMU (Li et al. 2024, WMDP): one layer's forget activations steered to a random direction",
    run={"text": RMU},
    hparams=RmuHparams,
    plan_shape=(2, 1),
)
