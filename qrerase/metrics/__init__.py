"""Evaluation metrics: the metric registry (:mod:`qrerase.metrics.registry`, standard library only),
membership-inference attacks (:mod:`qrerase.metrics.mia`), MUSE's PrivLeak
(:mod:`qrerase.metrics.privleak`) and teacher-forced memorisation (:mod:`qrerase.metrics.memorisation`).

Importing this package imports no torch: the attack modules are imported when a metric's function is
first loaded (:func:`qrerase.metrics.registry.metric_function`).
"""
