"""Model construction helpers (no hub access): a tiny random causal LM for tests and demos."""

from runner.models.tiny import CHAT_TEMPLATE, build_tiny_model, build_tokenizer, load_tiny_model

__all__ = ["CHAT_TEMPLATE", "build_tiny_model", "build_tokenizer", "load_tiny_model"]
