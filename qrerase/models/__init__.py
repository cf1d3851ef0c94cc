"""Model files: loading and saving Hugging Face checkpoints (:mod:`~qrerase.models.checkpoints`), what a
checkpoint folder must hold (:mod:`~qrerase.models.checkpoint_files`) and GGUF import
(:mod:`~qrerase.models.gguf`)."""
