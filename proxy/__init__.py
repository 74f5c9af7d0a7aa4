"""brimful: an OpenAI-compatible proxy in front of vLLM that keeps requests inside max_model_len."""

__version__ = "0.1.0"
