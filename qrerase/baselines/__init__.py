"""Optimisation-based unlearning baselines of the text tracks."""
