"""The model: config, weights and their loading, tokenizer, the transformer, RoPE, compiled layers,
random checkpoints."""
