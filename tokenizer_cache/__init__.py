"""Tokenizer loading and caching, chat-template rendering and prompt-token counting.

Counts prompt tokens exactly as vLLM does, from a model directory holding
`tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`).
"""
