"""Configuration: defaults < TOML file < BRIMFUL_* environment < command-line flags.

The schema is the dataclasses below; `config/brimful.toml` documents every
key.  Loading validates every value against its field's type and rejects an
unknown key with the closest valid name, so a typo in a deployed file fails at
start-up instead of silently doing nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tokenizer_cache import DEFAULT_CHAT_CACHE_ENTRIES, holds_tokenizer

MiB = 1024 * 1024


@dataclass
class Policy:
    """What the operator allows: the `[policy]` configuration table, and per model after
    `[models."name"]` overrides are applied (`Config.policy_for`)."""

    margin_tokens: int = 0
    margin_fraction: float = 0.0
    # The floor: where vLLM alone would refuse a request anyway, room below this is refused with
    # the surface's prompt-too-long error instead of clamped to a sliver (docs/agents.md).
    min_completion_tokens: int = 1
    # ... per API surface (its record `endpoint`: chat, completions, responses, messages).
    # Messages: 3,000, what Claude Code itself settles for when it lowers max_tokens after a
    # context error (docs/agents.md, "The floor").
    min_completion_tokens_by_surface: dict[str, int] = field(default_factory=lambda: {"messages": 3000})
    # vLLM >= 0.32 clamps prompt + max_tokens > max_model_len itself (it still refuses
    # max_tokens > max_model_len); false for an older engine that refuses any overflow.
    upstream_clamps_overflow: bool = True
    on_overflow: Literal["clamp", "reject"] = "clamp"
    # Drop whole turns of a conversation that does not fit with the floor (chat, Messages,
    # Responses): "oldest" first or from the "middle"; a request's x-brimful-trim header wins.
    trim: Literal["off", "oldest", "middle"] = "off"
    default_max_tokens: int | None = None
    max_tokens_ceiling: int | None = None
    truncate_inputs: bool = False       # pooling: cut inputs over max_model_len instead of refusing them

    def margin(self, prompt_tokens: int) -> int:
        return self.margin_tokens + math.ceil(self.margin_fraction * prompt_tokens)

    def floor(self, surface: str) -> int:
        """The fewest completion tokens worth granting on `surface` where vLLM would refuse anyway."""
        return self.min_completion_tokens_by_surface.get(surface, self.min_completion_tokens)


class ConfigError(ValueError):
    """A configuration value is missing, unknown or of the wrong type; the message names the key."""


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8100
    max_body_bytes: int = 32 * MiB          # larger bodies get 413
    api_keys: list[str] = field(default_factory=list)  # inbound keys; empty = no auth
    # brimful's pages (/metrics, /stats, /dashboard, the full /ready): their own keys,
    # else the API's; or a listener of their own (metrics_port), as Prometheus setups do.
    metrics_api_keys: list[str] = field(default_factory=list)
    metrics_host: str | None = None        # unset: host
    metrics_port: int = 0                  # 0: the pages are served on the main port
    shutdown_timeout: float = 30.0         # after SIGTERM: seconds in-flight requests may still run
    # Serving processes on the one port (proxy.workers.supervisor); 1 = this process serves.
    workers: int = 1
    # What one client connection may cost (proxy.serving.server): a longer head is
    # answered 431, a head or body that stops arriving 408.
    max_header_bytes: int = 64 * 1024
    header_timeout: float = 15.0           # connect (or keep-alive) to a complete request head
    body_timeout: float = 30.0             # longest gap between two pieces of a request body
    keepalive_timeout: float = 5.0         # an idle keep-alive connection is closed after this
    max_connections: int = 0               # client connections at once; 0 = what the fd limit allows
    # Name the upstream's URL in the errors clients get (always in the logs).
    show_upstream_url: bool = False


@dataclass
class UpstreamConfig:
    url: str = "http://127.0.0.1:8000"
    connect_timeout: float = 5.0
    # First byte and idle gap between stream chunks.  A non-streamed request
    # sends nothing until the whole generation is done: 32k tokens at 40 tok/s
    # is ~800 s, so the default stays above that.
    timeout: float = 900.0
    # Longest gap between two chunks of a body once the headers came (a stalled
    # stream); unset: the same as `timeout`.
    idle_timeout: float | None = None
    # One request's whole time, headers to last byte, however steadily it streams
    # (idle_timeout resets on every chunk); 0 = no limit.
    total_timeout: float = 0.0
    models_refresh_interval: float = 60.0
    # GET /v1/models (model discovery) gets this long, not the generation timeout above.
    models_timeout: float = 10.0
    # The max_model_len of a model whose /v1/models card gives none (or an invalid
    # one). Unset: such a model's requests are forwarded unclamped (with a warning).
    fallback_max_model_len: int | None = None
    api_key: str | None = None             # replaces the client's Authorization when set
    # Without api_key, forward the client's Authorization header upstream (false: drop it).
    forward_client_authorization: bool = True
    max_connections: int = 1024
    # Back-pressure (proxy.upstream.gate): at most this many chat/completions requests in
    # flight per upstream (0 = no cap); the excess waits up to queue_timeout
    # seconds for a slot, then gets 503 with Retry-After.
    max_concurrent_requests: int = 0
    queue_timeout: float = 30.0
    # Ask streams for the usage chunk (and hide it from clients that did not)
    # so every stream's prompt count can be checked against the upstream's.
    request_stream_usage: bool = True


@dataclass
class UpstreamEntry:
    """One more upstream (`[[upstreams]]`); timeouts and limits come from `[upstream]`."""

    name: str = ""
    url: str = ""
    api_key: str | None = None


@dataclass
class ModelConfig:
    """Per-model overrides; unset fields fall back to the upstream / [policy]."""

    max_model_len: int | None = None
    tokenizer: str | None = None
    # vLLM's --tokenizer-mode for this model: "auto" detects Mistral-format folders as vLLM does.
    tokenizer_mode: Literal["auto", "hf", "mistral"] = "auto"
    # Which rules build the tokenizer from the folder (tokenizer_cache._loader): "auto" follows
    # the upstream's GET /version (vLLM >= 0.19.1: transformers 5's AutoTokenizer; older:
    # tokenizer.json as it is); "transformers5" / "tokenizer_json" force one.
    tokenizer_loader: Literal["auto", "transformers5", "tokenizer_json"] = "auto"
    margin_tokens: int | None = None
    margin_fraction: float | None = None
    min_completion_tokens: int | None = None
    min_completion_tokens_by_surface: dict[str, int] | None = None
    upstream_clamps_overflow: bool | None = None
    on_overflow: Literal["clamp", "reject"] | None = None
    trim: Literal["off", "oldest", "middle"] | None = None
    default_max_tokens: int | None = None
    max_tokens_ceiling: int | None = None
    truncate_inputs: bool | None = None


@dataclass
class TokenizersConfig:
    cache_size: int = 8
    # Per-piece token counts (text between special tokens) remembered across
    # requests, so a conversation resent every turn only encodes what is new.
    piece_cache_entries: int = 65536
    hf_home: str | None = None
    # Bodies larger than this are counted in a worker thread so one long
    # prompt cannot stall the event loop for everyone else.
    offload_above_bytes: int = 16 * 1024
    # Memory for encoding long prompts at once (proxy.admitted.counting: ~256 B per body
    # byte); more waits (upstream.queue_timeout), then 503. One prompt larger
    # than this is counted alone.
    count_memory_bytes: int = 1024 * MiB
    # Compare each model's count with the upstream's /tokenize at start-up
    # (proxy.admitted.trust): a mismatch switches the model to the upstream's count.
    parity_check: bool = True
    # Whole-chat counts remembered by their exact template inputs: a repeated
    # request renders nothing (0 = off).
    chat_cache_entries: int = DEFAULT_CHAT_CACHE_ENTRIES
    # Which engine encodes text: "auto" takes fastokens wherever it passes its
    # load-time self-check against `tokenizers` (the reference) and `tokenizers`
    # elsewhere; "fastokens" is still self-checked; "tokenizers" never tries it.
    engine: Literal["auto", "tokenizers", "fastokens"] = "auto"
    # Where transformers 5's tokenizer builds are kept for the next process (a worker's replacement,
    # a restart): unset = $XDG_CACHE_HOME/brimful/tokenizer-builds (~/.cache/...), "" = nowhere.
    build_cache_dir: str | None = None


@dataclass
class LengthLogConfig:
    path: str | None = None
    max_bytes: int = 100 * MiB
    backups: int = 5
    # Seconds between the writer's rounds: what kill -9 can lose (0: a round per record).
    # bench/lengthlog_bench.py, 250 answered in bursts of 25: 0.1 s lost 4-44 records,
    # 0.02 s 5-7, 0 lost 0-1 at +0.15 ms of CPU per request (0.02 s: +0.04 ms).
    flush_interval: float = 0.02
    fsync: bool = False                    # sync each round to the disk (power loss)
    # "parquet": `path` is a directory of rolled Parquet files (proxy.recording.parquetlog), one per
    # replica, worker and roll_interval seconds; needs the `parquet` extra (pyarrow).
    format: Literal["jsonl", "parquet"] = "jsonl"
    roll_interval: float = 600.0
    replica: str = ""                      # the files' name prefix; empty: the host name


@dataclass
class OtelConfig:
    """OpenTelemetry export (proxy.recording.otel); everything else comes from the standard OTEL_* variables."""

    enabled: bool = False


@dataclass
class MetricsConfig:
    buckets: list[float] | None = None
    window: int = 10000                    # records kept per model for /stats


@dataclass
class UpstreamMetricsConfig:
    """The scrape of each upstream's /metrics (proxy.recording.live_sizing): its KV pool, usage, preemptions, queue."""

    enabled: bool = False
    path: str = "/metrics"
    interval_s: float = 15.0
    timeout_s: float = 5.0
    kv_usage_pinned: float = 0.9          # KV cache usage at or above this counts as pinned at peak
    pinned_scrapes: int = 2               # consecutive scrapes before pinned usage or waiting requests signal
    max_num_seqs: int | None = None       # the upstream's --max-num-seqs: tells scheduler queueing from memory


@dataclass
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    json: bool = False


@dataclass
class Config:
    server: ServerConfig = field(default_factory=ServerConfig)
    upstream: UpstreamConfig = field(default_factory=UpstreamConfig)
    upstreams: list[UpstreamEntry] = field(default_factory=list)
    policy: Policy = field(default_factory=Policy)
    models: dict[str, ModelConfig] = field(default_factory=dict)
    tokenizers: TokenizersConfig = field(default_factory=TokenizersConfig)
    length_log: LengthLogConfig = field(default_factory=LengthLogConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    upstream_metrics: UpstreamMetricsConfig = field(default_factory=UpstreamMetricsConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    otel: OtelConfig = field(default_factory=OtelConfig)

    def policy_for(self, model: str | None) -> Policy:
        """The admission policy for one model: [policy] with [models."name"] overrides."""
        override = self.models.get(model or "")
        if override is None:
            return self.policy
        changes = {
            f.name: getattr(override, f.name)
            for f in dataclasses.fields(Policy)
            if getattr(override, f.name, None) is not None
        }
        return dataclasses.replace(self.policy, **changes)


# ---------------------------------------------------------------------------
# Loading and validation
# ---------------------------------------------------------------------------

def load_config(
    path: str | os.PathLike[str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective configuration; raises ConfigError naming the key on any bad value.

    `overrides` are dotted keys from command-line flags (`{"upstream.url": ...}`).
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"configuration file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"configuration file {path} is not valid TOML: {exc}") from None
    config: Config = _build(Config, data, "")
    for dotted, raw in _env_overrides(os.environ if env is None else env).items():
        _set_dotted(config, dotted, raw, from_text=True, source="environment variable BRIMFUL_"
                    + dotted.replace(".", "_").upper())
    for dotted, value in (overrides or {}).items():
        if dotted == "upstreams" and value:
            # --upstream given more than once: the later ones are more upstreams, after the file's
            config.upstreams.extend(UpstreamEntry(name=f"upstream-{len(config.upstreams) + 2}", url=str(url))
                                    for url in value)
        elif value is not None and dotted != "upstreams":
            _set_dotted(config, dotted, value, from_text=False, source=f"flag for {dotted}")
    _check_semantics(config)
    return config


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'top level'}' must be a table, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(_unknown_key(prefix + key, key, names, prefix))
        kwargs[key] = _convert(hints[key], value, prefix + key)
    return cls(**kwargs)


def _convert(hint: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _build(hint, value, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, key)
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"'{key}' must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a table, got {_kind(value)}")
        return {str(k): _convert(args[1], v, f'{key}."{k}"') for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {_kind(value)}")
        return [_convert(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"'{key}' must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"'{key}' must be a whole number, got {value!r}")
        if value < 0:
            raise ConfigError(f"'{key}' must not be negative, got {value}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"'{key}' must be a number, got {value!r}")
        if value < 0:
            raise ConfigError(f"'{key}' must not be negative, got {value}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"'{key}' must be a string, got {value!r}")
        return value
    raise ConfigError(f"'{key}': unsupported type {hint}")  # pragma: no cover - schema bug


def _parse_text(hint: Any, text: str, key: str) -> Any:
    """Turn an environment variable's text into a value of the field's type."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if text == "" or text.lower() == "none":
            return None
        return _parse_text(next(a for a in args if a is not type(None)), text, key)
    if hint is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"'{key}' must be true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"'{key}' must be a whole number, got {text!r}") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"'{key}' must be a number, got {text!r}") from None
    if origin is list:
        return [_parse_text(args[0], part.strip(), key) for part in text.split(",") if part.strip()]
    return text


def _env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    """BRIMFUL_<SECTION>_<KEY> → "section.key" for every scalar key of every section."""
    found: dict[str, str] = {}
    sections = typing.get_type_hints(Config)
    for section in dataclasses.fields(Config):
        if section.name in ("models", "upstreams"):
            continue
        for fld in dataclasses.fields(sections[section.name]):
            name = f"BRIMFUL_{section.name}_{fld.name}".upper()
            if name in env:
                found[f"{section.name}.{fld.name}"] = env[name]
    return found


def _set_dotted(config: Config, dotted: str, value: Any, *, from_text: bool, source: str) -> None:
    section_name, key = dotted.split(".", 1)
    section = getattr(config, section_name)
    hint = typing.get_type_hints(type(section))[key]
    try:
        parsed = _parse_text(hint, value, dotted) if from_text else value
        setattr(section, key, _convert(hint, parsed, dotted))
    except ConfigError as exc:
        raise ConfigError(f"{exc} (from {source})") from None


def _check_semantics(config: Config) -> None:
    urls = [("upstream.url", config.upstream.url)]
    names = set()
    for i, entry in enumerate(config.upstreams):
        if not entry.name:
            raise ConfigError(f"'upstreams[{i}].name' is required (a label for logs and metrics)")
        if entry.name in names or entry.name == "default":
            raise ConfigError(f"'upstreams[{i}].name' = {entry.name!r} is used twice ('default' is [upstream])")
        names.add(entry.name)
        urls.append((f"upstreams[{i}].url", entry.url))
    for key, url in urls:
        if not (url.startswith("http://") or url.startswith("https://")):
            raise ConfigError(f"'{key}' must start with http:// or https://, got {url!r}")
    if config.policy.min_completion_tokens < 1 or min(config.policy.min_completion_tokens_by_surface.values(),
                                                      default=1) < 1:
        raise ConfigError("'policy.min_completion_tokens' (and each of min_completion_tokens_by_surface) "
                          "must be at least 1")
    if not 0 <= config.policy.margin_fraction < 1:
        raise ConfigError(f"'policy.margin_fraction' must be in [0, 1), got {config.policy.margin_fraction}")
    um = config.upstream_metrics
    if not um.path.startswith("/"):
        raise ConfigError(f"'upstream_metrics.path' must start with /, got {um.path!r}")
    for key in ("interval_s", "timeout_s"):
        if getattr(um, key) <= 0:
            raise ConfigError(f"'upstream_metrics.{key}' must be above 0, got {getattr(um, key)}")
    if not 0 < um.kv_usage_pinned <= 1:
        raise ConfigError(f"'upstream_metrics.kv_usage_pinned' must be in (0, 1], got {um.kv_usage_pinned}")
    if um.pinned_scrapes < 1 or (um.max_num_seqs is not None and um.max_num_seqs < 1):
        raise ConfigError("'upstream_metrics.pinned_scrapes' and 'upstream_metrics.max_num_seqs' must be at least 1")
    _check_length_log(config.length_log)
    if config.otel.enabled:
        try:
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError:
            raise ConfigError("otel.enabled needs the OpenTelemetry SDK: pip install 'brimful[otel]'") from None
    if config.server.workers < 1:
        raise ConfigError(f"'server.workers' must be at least 1, got {config.server.workers}")
    if not 0 < config.server.port < 65536:
        raise ConfigError(f"'server.port' must be 1–65535, got {config.server.port}")
    if config.server.metrics_port >= 65536 or config.server.metrics_port == config.server.port:
        raise ConfigError(f"'server.metrics_port' must be 0 (off) or a port other than server.port (1–65535), "
                          f"got {config.server.metrics_port}")
    if config.upstream.fallback_max_model_len is not None and config.upstream.fallback_max_model_len < 1:
        raise ConfigError("'upstream.fallback_max_model_len' must be at least 1")
    for name, model in config.models.items():
        if model.max_model_len is not None and model.max_model_len < 1:
            raise ConfigError(f"'models.\"{name}\".max_model_len' must be at least 1")
        if model.tokenizer is not None and not holds_tokenizer(Path(model.tokenizer)):
            raise ConfigError(
                f"'models.\"{name}\".tokenizer' = {model.tokenizer!r} is not a directory holding tokenizer.json "
                "(or, for a Mistral-format model, tekken.json or tokenizer.model.v*)"
            )


def _check_length_log(ll: LengthLogConfig) -> None:
    if ll.format != "parquet":
        return
    if ll.path == "-":
        raise ConfigError("'length_log.path' = \"-\" (standard output) needs length_log.format = \"jsonl\"")
    if ll.roll_interval <= 0:
        raise ConfigError(f"'length_log.roll_interval' must be above 0, got {ll.roll_interval}")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ConfigError("length_log.format = \"parquet\" needs pyarrow: pip install 'brimful[parquet]'") from None


def _unknown_key(full: str, key: str, valid: list[str], prefix: str) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys here: {', '.join(valid)}"
    return f"unknown configuration key '{full}'{hint}"


def _kind(value: Any) -> str:
    return type(value).__name__
