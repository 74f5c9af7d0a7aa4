"""Shared test helpers: the fake vLLM, in-thread servers, brimful stacks, transports, deploy
linters, and the scripts that prepare test data (npm-packed tokenizers)."""
