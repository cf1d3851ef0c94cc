"""The tiny HuBERT classifier shape the speech tests build (``qrerase.tracks.speech.model.TinyHubertConfig``
keyword arguments): small enough to train in seconds on the CPU."""

TINY_HUBERT = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    conv_dim=(8, 16, 16, 16),
    num_conv_pos_embeddings=4,
    num_conv_pos_embedding_groups=2,
    classifier_proj_size=16,
)
