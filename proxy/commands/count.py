"""`brimful count`: count a request's prompt tokens offline, as vLLM would.

    brimful count [--tokenizer DIR | --model ID] [--endpoint chat|completions] [FILE|-]
    brimful count --jsonl CASES.jsonl --models-root DIR

Without --tokenizer, the tokenizer is looked up in the Hugging Face cache
($HF_HOME/hub/models--ORG--NAME/snapshots/*/, where vLLM downloads models) by
--model, else by the request's own "model"; nothing is downloaded.

The first form prints `{"prompt_tokens": N}` (plus `"per_prompt"` for a
completions request with several prompts), or `{"error": {...}}` with exit
code 1 for a request vLLM would refuse; unreadable input exits 2.  The second
reads corpus-format lines (`id`, `model_dir`, `endpoint`, `request`) and prints
one result line per case, loading each tokenizer once.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
from typing import Any, TextIO

from tokenizer_cache import (
    CountError,
    CountingModel,
    MediaNotCountable,
    TokenizerCache,
    count_messages,
    count_responses,
    find_tokenizer_dir,
    load_model_tokenizer,
)

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_BAD_INPUT = 2
EXIT_UNCOUNTED = 3      # media brimful cannot count (vLLM would serve the request)


def register(subparsers: Any) -> None:
    """Add the `count` sub-command to an argparse subparsers object."""
    parser = subparsers.add_parser(
        "count",
        help="count a request's prompt tokens exactly as vLLM would",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(parser)
    parser.set_defaults(func=run)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tokenizer", metavar="DIR", help="model directory holding tokenizer.json")
    parser.add_argument("--model", metavar="ID",
                        help="find the tokenizer of this model id in the Hugging Face cache "
                             "(default: the request's \"model\")")
    parser.add_argument(
        "--endpoint",
        choices=ENDPOINTS,
        help="request kind (default: chat if the body has 'messages', completions if it has 'prompt', "
             "responses if it has 'input'; an Anthropic Messages body needs --endpoint messages)",
    )
    parser.add_argument("input", nargs="?", default="-", metavar="FILE|-", help="request body (default: stdin)")
    parser.add_argument("--jsonl", metavar="FILE", help="corpus-format cases, one JSON object per line")
    parser.add_argument("--models-root", metavar="DIR", help="directory the cases' model_dir is relative to")


# The bodies `count_request` counts: chat, completions, and the Responses and Anthropic Messages
# requests vLLM renders as chats.
ENDPOINTS = ("chat", "completions", "responses", "messages")


def _emit(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")


def _endpoint_of(body: dict[str, Any], given: str | None) -> str | None:
    if given:
        return given
    if "messages" in body:
        return "chat"
    if "prompt" in body:
        return "completions"
    if "input" in body:
        return "responses"
    return None


def count_request(tokenizer: CountingModel, endpoint: str, body: Any) -> dict[str, Any]:
    """The result object for one request body (raises CountError on rejection)."""
    if endpoint == "chat":
        return {"prompt_tokens": tokenizer.count_chat(body)}
    if endpoint == "responses":
        return {"prompt_tokens": count_responses(tokenizer, body)}
    if endpoint == "messages":
        return {"prompt_tokens": count_messages(tokenizer, body)}
    per_prompt = tokenizer.count_completion(body)
    result: dict[str, Any] = {"prompt_tokens": sum(per_prompt)}
    if len(per_prompt) > 1:
        result["per_prompt"] = per_prompt
    return result


def _run_single(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        text = sys.stdin.read() if args.input == "-" else pathlib.Path(args.input).read_text(encoding="utf-8")
        body = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        err.write(f"brimful count: cannot read {args.input}: {exc}\n")
        return EXIT_BAD_INPUT
    except ValueError as exc:
        err.write(f"brimful count: {args.input} is not valid JSON: {exc}\n")
        return EXIT_BAD_INPUT
    if not isinstance(body, dict):
        err.write("brimful count: the request body must be a JSON object\n")
        return EXIT_BAD_INPUT
    endpoint = _endpoint_of(body, args.endpoint)
    if endpoint is None:
        err.write("brimful count: cannot tell the endpoint (no 'messages', 'prompt' or 'input'); pass --endpoint\n")
        return EXIT_BAD_INPUT
    directory = args.tokenizer or _cached_tokenizer_dir(args.model or body.get("model"), err)
    if directory is None:
        return EXIT_BAD_INPUT
    try:
        tokenizer = load_model_tokenizer(directory)
    except (OSError, ValueError) as exc:
        err.write(f"brimful count: {exc}\n")
        return EXIT_BAD_INPUT
    try:
        _emit(out, count_request(tokenizer, endpoint, body))
    except CountError as exc:
        _emit(out, {"error": {"message": exc.message, "param": exc.param}})
        return EXIT_REJECTED
    except MediaNotCountable as exc:
        # Not a refusal: vLLM would serve it; only its count is out of reach here.
        _emit(out, {"uncounted": {"reason": exc.reason, "message": str(exc)}})
        return EXIT_UNCOUNTED
    return EXIT_OK


def _cached_tokenizer_dir(model: Any, err: TextIO) -> pathlib.Path | None:
    """The model's tokenizer in the Hugging Face cache, or None (and why, on err)."""
    if not isinstance(model, str) or not model:
        err.write("brimful count: pass --tokenizer DIR or --model ID (the request names no model)\n")
        return None
    found = find_tokenizer_dir(model, None)
    if found is None:
        hub = pathlib.Path(os.environ.get("HF_HOME") or "~/.cache/huggingface").expanduser() / "hub"
        err.write(f"brimful count: no tokenizer for {model} in the Hugging Face cache ({hub}); "
                  "pass --tokenizer DIR (a folder holding tokenizer.json)\n")
    return found


def _case_result(cache: TokenizerCache, root: pathlib.Path, line: str, number: int) -> dict[str, Any]:
    try:
        case = json.loads(line)
    except ValueError as exc:
        return {"id": None, "line": number, "error": f"malformed line: {exc}"}
    if not isinstance(case, dict):
        return {"id": None, "line": number, "error": "malformed line: not a JSON object"}
    case_id = case.get("id")
    model_dir, request = case.get("model_dir"), case.get("request")
    if not isinstance(model_dir, str) or not isinstance(request, dict):
        return {"id": case_id, "error": "malformed line: needs 'model_dir' (string) and 'request' (object)"}
    endpoint = _endpoint_of(request, case.get("endpoint"))
    if endpoint not in ENDPOINTS:
        return {"id": case_id, "error": f"malformed line: unknown endpoint {case.get('endpoint')!r}"}
    try:
        tokenizer = cache.get(root / model_dir)
    except (OSError, ValueError) as exc:
        return {"id": case_id, "error": f"cannot load tokenizer: {exc}"}
    try:
        return {"id": case_id, **count_request(tokenizer, endpoint, request)}
    except CountError as exc:
        return {"id": case_id, "error": exc.message}
    except MediaNotCountable as exc:
        return {"id": case_id, "uncounted": exc.reason}


def _run_jsonl(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not args.models_root:
        err.write("brimful count: --jsonl needs --models-root DIR\n")
        return EXIT_BAD_INPUT
    root = pathlib.Path(args.models_root)
    cache = TokenizerCache(max_entries=64)
    try:
        # stdin or the file: the one `with` below closes either
        handle = sys.stdin if args.jsonl == "-" else open(args.jsonl, encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        err.write(f"brimful count: cannot read {args.jsonl}: {exc}\n")
        return EXIT_BAD_INPUT
    with handle:
        for number, line in enumerate(handle, start=1):
            if line.strip():
                _emit(out, _case_result(cache, root, line, number))
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    """Entry point for the parsed `count` sub-command; returns the exit code."""
    if args.jsonl:
        return _run_jsonl(args, sys.stdout, sys.stderr)
    return _run_single(args, sys.stdout, sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """`python -m proxy.commands.count …`, the same as `brimful count …`."""
    parser = argparse.ArgumentParser(prog="brimful count", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
