"""Optimisation-based unlearning baselines of the text tracks, one module each.

A baseline module holds its hyperparameter dataclass, its objective (a
:class:`~qrerase.baselines.objective.TextObjective` subclass) and its
:func:`qrerase.registry.register_method` call, and imports torch only inside the functions that compute
(the workflow imports it at planning time). :data:`MODULES` lists the built-in ones in table order; the
registry imports them. A plug-in baseline is the same one module, named in the config key ``plugins``
(CONTRIBUTING.md).
"""

#: The built-in baseline modules, in table order (the registry imports them after the subspace methods).
MODULES = ("standard", "simnpo", "rmu", "undial")

# Imported before any baseline module runs, so that the registry imports them all in table order (when a
# baseline module is imported first, this package's initialisation runs before it).
from .. import registry as _registry  # noqa: E402,F401
