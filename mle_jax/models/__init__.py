"""Model definitions: Flax NNX Qwen2, value head, HF weight IO, tokenizers."""
