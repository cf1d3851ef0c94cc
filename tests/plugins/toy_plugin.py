"""A plug-in for tests and docs/extending.md: two toy text baselines, each one registration next to its
objective, in this one module.

``toy_ga`` has no hyperparameter of its own; ``toy_scaled`` declares one, ``toy_scale`` (its dataclass
:class:`ToyScale`, validated on construction and generated into the config schema's baselines section
of the text runner). The workflow imports this module at planning time (config key ``plugins``), so it
is torch-free at import: the objectives compute with tensor methods only, when a job runs them.
"""

from dataclasses import dataclass

from qrerase.baselines.objective import TextObjective, token_mean_nll
from qrerase.hparams import Hparams, hparam
from qrerase.registry import register_method


@dataclass
class ToyScale(Hparams):
    """The toy scaled ascent's own hyperparameter."""

    toy_scale: float = hparam(0.5, "s: the factor of the toy objective, L = -s x the forget NLL", gt=0)


class HalfAscent(TextObjective):
    """``L = −ℓ_tok(B_f) / 2``: half a Gradient Ascent step on the forget answers."""

    def full(self, payload):
        idx, _ = payload
        nll, n = self._nll(self.forget_ex, idx)
        return -0.5 * token_mean_nll(nll, n), {"forget_nll": float(token_mean_nll(nll, n).detach())}

    def _piece(self, f, f_live, r, r_live, whole):
        # a micro-batch's share of the step loss: its NLL sum over the whole batch's token count
        nll, n = self._nll(self.forget_ex, f)
        loss = -0.5 * nll.sum() * (float(f_live) / whole["nf"])
        return loss, {"forget_nll": float(token_mean_nll(nll, n).detach())}


class ScaledAscent(TextObjective):
    """``L = −s · ℓ_tok(B_f)`` with ``s`` = ``toy_scale``, the plug-in's own hyperparameter (``self.hparams``)."""

    def full(self, payload):
        idx, _ = payload
        nll, n = self._nll(self.forget_ex, idx)
        return -self.hparams.toy_scale * token_mean_nll(nll, n), {"forget_nll": float(token_mean_nll(nll, n).detach())}

    def _piece(self, f, f_live, r, r_live, whole):
        nll, n = self._nll(self.forget_ex, f)
        loss = -self.hparams.toy_scale * nll.sum() * (float(f_live) / whole["nf"])
        return loss, {"forget_nll": float(token_mean_nll(nll, n).detach())}


# Each registration names its runner's implementation; the track is the one that brings the runner.
register_method(
    "toy_ga",
    label="Toy Half Ascent",
    description="the toy baseline (half GA)",
    run={"text": HalfAscent},
    plan_shape=(1, 0),
)
register_method(
    "toy_scaled",
    label="Toy Scaled Ascent",
    description="the toy baseline with its own hyperparameter (toy_scale x GA)",
    run={"text": ScaledAscent},
    hparams=ToyScale,
    plan_shape=(1, 0),
)
