"""Text models and protocols: causal-LM plumbing, training, the TOFU protocol, task-level and cross-lingual data."""
