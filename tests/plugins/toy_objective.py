"""The toy plug-in baseline's implementation (tests/plugins/toy_plugin.py registers it)."""

from qrerase.baselines.losses import token_mean_nll
from qrerase.baselines.objective import TextObjective


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
    """``L = −s · ℓ_tok(B_f)`` with ``s`` = ``toy_scale``, the plug-in's own hyperparameter (``cfg.hparams``)."""

    def full(self, payload):
        idx, _ = payload
        nll, n = self._nll(self.forget_ex, idx)
        return -self.hparams.toy_scale * token_mean_nll(nll, n), {"forget_nll": float(token_mean_nll(nll, n).detach())}

    def _piece(self, f, f_live, r, r_live, whole):
        nll, n = self._nll(self.forget_ex, f)
        loss = -self.hparams.toy_scale * nll.sum() * (float(f_live) / whole["nf"])
        return loss, {"forget_nll": float(token_mean_nll(nll, n).detach())}
