"""Shared test helpers: the fake vLLM, in-thread servers, headroom stacks, transports, deploy linters."""
