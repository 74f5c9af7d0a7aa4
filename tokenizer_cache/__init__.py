"""Tokenizer loading and caching, chat-template rendering and prompt-token counting.

Counts prompt tokens exactly as vLLM does, from a model directory, with the
renderer vLLM picks for it (`detect_family`): `tokenizer.json` +
`tokenizer_config.json` (+ `chat_template.jinja`) with `tokenizers` and
`jinja2` for most models; openai-harmony for gpt-oss (`HarmonyTokenizer`);
mistral-common for Mistral-format folders (`MistralTokenizer`, optional extra):

    tokenizer = TokenizerCache().get(find_tokenizer_dir("Qwen/Qwen3-8B", root=None))
    tokenizer.count_chat({"messages": [{"role": "user", "content": "Hi"}]})

`get(directory, tokenizer_mode)` takes vLLM's `--tokenizer-mode` for the model
("auto" by default).  Every loaded model satisfies `CountingModel`.

The tokenizer is the one vLLM 0.32 builds: transformers 5's AutoTokenizer
picks a class that may rebuild the normalizer and pre-tokenizer around
tokenizer.json's vocabulary (`tokenizer_loader`, `loader_for_vllm`).

Anthropic Messages and OpenAI Responses requests are counted as the chat
request vLLM converts them to (`count_messages`, `count_responses`).

Models loaded through a TokenizerCache count through a shared per-piece
cache: text between added tokens is encoded once, so a conversation resent
every turn only costs its new messages (`PieceCountCache`, `PieceTally`).

Everything else lives in private modules; import from here.
"""

from ._anthropic import count_messages
from ._build_store import default_directory as default_build_cache_dir
from ._build_store import use_build_store
from ._cache import TokenizerCache
from ._char_bound import CharBoundExceeded, char_bound, char_bound_message
from ._chat import lax_bool
from ._chat_cache import DEFAULT_MAX_ENTRIES as DEFAULT_CHAT_CACHE_ENTRIES
from ._chat_cache import ChatCacheStats, ChatCountCache
from ._errors import CountError, MediaNotCountable
from ._family import TOKENIZER_MODES, detect_family
from ._gptoss import HarmonyTokenizer
from ._harmony import HarmonyOptions
from ._json import json_loads, read_json
from ._json import plain as plain_json
from ._loader import LOADERS as TOKENIZER_LOADERS
from ._loader import loader_for_vllm
from ._locate import find_tokenizer_dir, holds_tokenizer
from ._mistral import MistralTokenizer
from ._model import ModelTokenizer, load_model_tokenizer
from ._piece_cache import DEFAULT_MAX_ENTRIES as DEFAULT_PIECE_CACHE_ENTRIES
from ._piece_cache import PieceCacheStats, PieceCountCache
from ._piece_count import PieceCounter, PieceTally, encoded_chars, start_encode_meter
from ._protocol import CountingModel
from ._responses import count_responses
from ._responses import in_request_terms as responses_terms
from ._responses import to_chat_request as responses_to_chat

__all__ = [
    "DEFAULT_CHAT_CACHE_ENTRIES",
    "DEFAULT_PIECE_CACHE_ENTRIES",
    "TOKENIZER_LOADERS",
    "TOKENIZER_MODES",
    "CharBoundExceeded",
    "ChatCacheStats",
    "ChatCountCache",
    "CountError",
    "CountingModel",
    "HarmonyOptions",
    "HarmonyTokenizer",
    "MediaNotCountable",
    "MistralTokenizer",
    "ModelTokenizer",
    "PieceCacheStats",
    "PieceCountCache",
    "PieceCounter",
    "PieceTally",
    "TokenizerCache",
    "char_bound",
    "char_bound_message",
    "count_messages",
    "count_responses",
    "default_build_cache_dir",
    "detect_family",
    "encoded_chars",
    "find_tokenizer_dir",
    "holds_tokenizer",
    "json_loads",
    "lax_bool",
    "load_model_tokenizer",
    "loader_for_vllm",
    "plain_json",
    "read_json",
    "responses_terms",
    "responses_to_chat",
    "start_encode_meter",
    "use_build_store",
]
