"""Speech track: speaker identification with a HuBERT-architecture classifier (paper §4.3)."""
