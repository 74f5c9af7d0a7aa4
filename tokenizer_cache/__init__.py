"""Tokenizer loading and caching, chat-template rendering and prompt-token counting.

Counts prompt tokens exactly as vLLM does, from a model directory holding
`tokenizer.json` + `tokenizer_config.json` (+ `chat_template.jinja`), with only
`tokenizers` and `jinja2`:

    tokenizer = TokenizerCache().get(find_tokenizer_dir("Qwen/Qwen3-8B", root=None))
    tokenizer.count_chat({"messages": [{"role": "user", "content": "Hi"}]})

Anthropic Messages and OpenAI Responses requests are counted as the chat
request vLLM converts them to (`count_messages`, `count_responses`).

Models loaded through a TokenizerCache count through a shared per-piece
cache: text between added tokens is encoded once, so a conversation resent
every turn only costs its new messages (`PieceCountCache`, `PieceTally`).

Everything else lives in private modules; import from here.
"""

from ._cache import TokenizerCache
from ._chat import UnsupportedContent
from ._errors import CountError
from ._locate import find_tokenizer_dir
from ._model import ModelTokenizer, load_model_tokenizer
from ._piece_cache import DEFAULT_MAX_ENTRIES as DEFAULT_PIECE_CACHE_ENTRIES
from ._piece_cache import PieceCacheStats, PieceCountCache
from ._piece_count import PieceCounter, PieceTally
from ._responses import to_chat_request as responses_to_chat

__all__ = [
    "DEFAULT_PIECE_CACHE_ENTRIES",
    "CountError",
    "ModelTokenizer",
    "PieceCacheStats",
    "PieceCountCache",
    "PieceCounter",
    "PieceTally",
    "TokenizerCache",
    "UnsupportedContent",
    "find_tokenizer_dir",
    "load_model_tokenizer",
    "responses_to_chat",
]
