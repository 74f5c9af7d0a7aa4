"""Fast tokenizer engines against `tokenizers`: exactness first, then speed.

    python bench/engine_bench.py exactness [--random 3000]
    python bench/engine_bench.py speed [--rounds 5]
    python bench/engine_bench.py chat [--rounds 5]
    python bench/engine_bench.py rebuilt [--rounds 5]

`exactness`: for every tokenizer in ../shared/models, every corpus request
rendered with brimful's renderer plus `--random` texts from tests/support/textgen.py
(and for tokenizers edited to use the flags the shipped ones lack: lstrip,
single_word, Metaspace, a BOS/EOS post-processor, encode_special_tokens ...),
each encoded with add_special_tokens off and on: the token ids of each engine
are compared with `tokenizers`' `encode`.  A row says how many texts differ.

`speed`: the same text (Python source, English documentation, Korean; about
1k / 10k / 100k tokens) encoded by each engine and by `encode_batch_fast` in
the same run: process CPU ms (all threads) and wall ms, medians of --rounds
after one warm-up, and the ratio to encode_batch_fast.  Also whether each
engine releases the GIL: two threads counting at once vs one after the other.

`chat`: count_chat of a 100k / 10k / 800-token chat on Qwen3-8B through
brimful with each encoder (rendering included), CPU ms and ratio.

`rebuilt`: Phi-3-mini and -medium as transformers 5 rebuilds them (a folder
with a qwen3/llama config.json: LlamaTokenizer, Metaspace prepend_scheme
"first"), count_text of the speed texts with `tokenizers` (what counted them
before fastokens could load that form) against the engine the load picks now
(fastokens over the Metaspace-free form, `_encoder.metaspace_as_normalizer`),
same run, CPU ms and ratio; the counts must be equal.

Candidates: fastokens, tokie, kitoken (PyPI; `pip install` them), bpe-openai
(only OpenAI's own encodings, it cannot load a tokenizer.json).  Not a test.
"""

from __future__ import annotations

import argparse
import gc
import json
import pathlib
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.textgen import random_texts  # noqa: E402
from tokenizer_cache import CountError, load_model_tokenizer  # noqa: E402

SHARED = ROOT.parent / "shared"
MODELS = SHARED / "models"
CORPUS = [SHARED / "corpus" / "token_cases.jsonl", SHARED / "corpus" / "token_cases_spm.jsonl"]


class Engine(Protocol):
    def ids(self, text: str, add_special_tokens: bool) -> list[int]: ...
    def count(self, text: str, add_special_tokens: bool) -> int: ...


class Reference:
    def __init__(self, spec: str, encode_special_tokens: bool) -> None:
        self.tok = Tokenizer.from_str(spec)
        self.tok.encode_special_tokens = encode_special_tokens

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens).ids

    def count(self, text: str, add_special_tokens: bool) -> int:
        return len(self.tok.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0])


class Fastokens:
    def __init__(self, spec: str, encode_special_tokens: bool) -> None:
        import fastokens

        self.tok = fastokens.Tokenizer.from_json_str(spec)
        self.tok.no_truncation()
        self.tok.no_padding()
        self.split = encode_special_tokens

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tok.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=self.split).ids

    def count(self, text: str, add_special_tokens: bool) -> int:
        return len(self.tok.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=self.split))


class Tokie:
    def __init__(self, spec: str, encode_special_tokens: bool) -> None:
        import tempfile

        import tokie

        if encode_special_tokens:
            raise NotImplementedError("no switch for encoding special tokens as text")
        with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8") as handle:
            handle.write(spec)
            handle.flush()
            self.tok = tokie.Tokenizer.from_json(handle.name)

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def count(self, text: str, add_special_tokens: bool) -> int:
        return len(self.tok.encode(text, add_special_tokens=add_special_tokens))


class Kitoken:
    def __init__(self, spec: str, encode_special_tokens: bool) -> None:
        import kitoken

        self.tok = kitoken.Kitoken.from_tokenizers(spec.encode("utf-8"))
        self.specials = not encode_special_tokens

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        # No post-processor switch: kitoken applies its templates (if any) always.
        return list(self.tok.encode(text, self.specials))

    def count(self, text: str, add_special_tokens: bool) -> int:
        return len(self.tok.encode(text, self.specials))


class BpeOpenai:
    def __init__(self, spec: str, encode_special_tokens: bool) -> None:
        raise NotImplementedError("loads only cl100k/o200k/voyage3, not a tokenizer.json")

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        raise NotImplementedError

    def count(self, text: str, add_special_tokens: bool) -> int:
        raise NotImplementedError


ENGINES: dict[str, Callable[[str, bool], Engine]] = {
    "fastokens": Fastokens,
    "tokie": Tokie,
    "kitoken": Kitoken,
    "bpe-openai": BpeOpenai,
}


def version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version(name)
    except PackageNotFoundError:
        return "not installed"


# ---------------------------------------------------------------------------
# Exactness
# ---------------------------------------------------------------------------

def corpus_texts(model_dir: pathlib.Path) -> list[tuple[str, bool]]:
    """(text, add_special_tokens) of each corpus request of this model, as brimful renders it."""
    model = load_model_tokenizer(model_dir)
    out = []
    for path in CORPUS:
        for line in path.read_text(encoding="utf-8").splitlines():
            case = json.loads(line)
            if pathlib.Path(case["model_dir"]).name != model_dir.name or case["expected_error"]:
                continue
            request = case["request"]
            try:
                if case["endpoint"] == "chat":
                    text, add = model._render(request)
                    out.append((text, add))
                else:
                    prompts = request["prompt"] if isinstance(request["prompt"], list) else [request["prompt"]]
                    add = bool(request.get("add_special_tokens", True))
                    out += [(p, add) for p in prompts if isinstance(p, str)]
            except CountError:
                continue
    return out


def variants() -> dict[str, tuple[str, bool]]:
    """Edited tokenizers (from tests/support/tokenizer_variants.py) as (tokenizer.json text, encode_special_tokens)."""
    from tests.support.tokenizer_variants import EXACT_VARIANTS, FALLBACK_VARIANTS

    out = {}
    for name, make in EXACT_VARIANTS.items():
        tok = make()
        out[name] = (tok.to_str(), tok.encode_special_tokens)
    for name, (make, _, _) in FALLBACK_VARIANTS.items():
        if name == "bpe-dropout":
            continue  # random by design
        tok = make()
        out[name] = (tok.to_str(), tok.encode_special_tokens)
    return out


def check(engine: Engine, reference: Reference, texts: list[tuple[str, bool]]) -> tuple[int, int, str]:
    """(texts compared, texts that differ, the shortest differing text)."""
    bad: list[str] = []
    for text, add in texts:
        try:
            same = engine.ids(text, add) == reference.ids(text, add)
        except Exception as exc:  # an engine failing on a text counts as a difference
            same = False
            text = f"{text} [raised {type(exc).__name__}: {str(exc)[:60]}]"
        if not same:
            bad.append(text)
    example = min(bad, key=len) if bad else ""
    return len(texts), len(bad), example


def run_exactness(args: argparse.Namespace) -> None:
    names = args.engines
    print("engines: " + ", ".join(f"{n} {version(n)}" for n in names) + f"; tokenizers {version('tokenizers')}")
    print(f"random texts per tokenizer: {args.random} (x2: add_special_tokens off/on), seed = name length")
    print()
    print(f"{'tokenizer':44} {'texts':>6} " + " ".join(f"{n:>14}" for n in names))
    tables: list[tuple[str, str, bool, list[tuple[str, bool]]]] = []
    for model_dir in sorted(d for d in MODELS.iterdir() if (d / "tokenizer.json").is_file()):
        spec = (model_dir / "tokenizer.json").read_text(encoding="utf-8")
        ref = Tokenizer.from_str(spec)
        texts = corpus_texts(model_dir)
        texts += [(t, add) for t in random_texts(ref, args.random, seed=len(model_dir.name)) for add in (False, True)]
        tables.append((model_dir.name, spec, False, texts))
    for name, (spec, est) in variants().items():
        ref = Tokenizer.from_str(spec)
        texts = [(t, add) for t in random_texts(ref, args.random // 3, seed=len(name)) for add in (False, True)]
        tables.append(("edited: " + name, spec, est, texts))
    examples = []
    for label, spec, est, texts in tables:
        reference = Reference(spec, est)
        cells = []
        for name in names:
            try:
                engine = ENGINES[name](spec, est)
            except Exception as exc:
                cells.append("cannot load")
                examples.append(f"{label} / {name}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            _, bad, example = check(engine, reference, texts)
            cells.append("identical" if not bad else f"{bad} differ")
            if bad:
                examples.append(f"{label} / {name}: e.g. {example[:120]!r}")
        print(f"{label:44} {len(texts):6d} " + " ".join(f"{c:>14}" for c in cells), flush=True)
    print()
    for line in examples:
        print(line)


# ---------------------------------------------------------------------------
# Speed
# ---------------------------------------------------------------------------

def source_texts() -> dict[str, str]:
    """Python source (the stdlib), English documentation (pydoc topics), Korean (shared/seeds)."""
    import pydoc_data.topics

    stdlib = pathlib.Path(json.__file__).resolve().parents[1]
    code = "".join(p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:120])
    prose = "\n\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    korean = "\n".join(p.read_text(encoding="utf-8") for p in sorted((SHARED / "seeds").glob("*.txt")))
    return {"code": code, "prose": prose, "korean": korean}


def text_of_tokens(ref: Tokenizer, source: str, target: int) -> str:
    """A prefix of `source` (repeated if too short) holding about `target` tokens."""
    per_char = len(ref.encode(source[:20000], add_special_tokens=False)) / min(len(source), 20000)
    chars = int(target / per_char)
    while len(source) < chars:
        source += "\n" + source
    text = source[:chars]
    got = len(ref.encode(text, add_special_tokens=False))
    return source[: int(chars * target / got)]


def timed(fn: Callable[[], Any], rounds: int) -> tuple[float, float, float]:
    """(median CPU s of all threads, median wall s, first-call wall s)."""
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    cpu, wall = [], []
    for _ in range(rounds):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
    return statistics.median(cpu), statistics.median(wall), first


def gil_share(count: Callable[[], Any], rounds: int = 5) -> float:
    """How much a pure-Python thread gets done while `count` runs, relative to
    running alone: ~1 when the engine releases the GIL (a free core), ~0 when
    it holds it for the whole count."""
    count()
    done = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            done[0] += 1

    def rate(work: Callable[[], Any]) -> float:
        done[0] = 0
        stop.clear()
        thread = threading.Thread(target=spin)
        thread.start()
        start = time.perf_counter()
        work()
        elapsed = time.perf_counter() - start
        stop.set()
        thread.join()
        return done[0] / elapsed

    def for_a_while() -> None:  # at least 0.2 s of counting, so thread start-up is noise
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            count()

    alone = statistics.median(rate(lambda: time.sleep(0.2)) for _ in range(rounds))
    during = statistics.median(rate(for_a_while) for _ in range(rounds))
    return during / alone


SPEED_MODELS = ["Qwen--Qwen3-8B", "deepseek-ai--DeepSeek-V3.1", "microsoft--Phi-3-mini-4k-instruct"]


def unseen_warmup(sources: dict[str, str], kind: str) -> str:
    """What an engine counts before an "unseen" measurement: 20k characters of each
    other kind of text, as a process that served other prompts has (tables paged
    in, lazy set-up done), without this text's words in any cache."""
    return "\n".join(text[:20_000] for other, text in sources.items() if other != kind)


def cold_cpu(make: Callable[[], Engine], text: str, rounds: int, warmup: str = "warm up 준비 🙂") -> float:
    """Median CPU s of the first count of `text` by a freshly loaded engine that
    counted only `warmup` before: no word cache holds this text's words yet."""
    times = []
    for _ in range(rounds):
        engine = make()
        engine.count(warmup, False)
        gc.collect()  # a collection of the loader's garbage is not counting
        start = time.process_time()
        engine.count(text, False)
        times.append(time.process_time() - start)
    return statistics.median(times)


def run_speed(args: argparse.Namespace) -> None:
    names = args.engines
    sources = source_texts()
    print(f"CPU ms = process CPU time (all threads).  cold: first count of the text by a fresh engine that "
          f"counted only 40k characters of the other kinds before, median of {args.cold} loads; warm: the same "
          f"text again, median of {args.rounds}.")
    print("ratio = engine / tokenizers' encode_batch_fast on the same text in the same run")
    header = f"{'model':34} {'text':7} {'tokens':>7} {'ref cold':>9} {'ref warm':>9}"
    for n in names:
        header += f" | {n + ' cold':>15} {'ratio':>6} {'warm':>7} {'ratio':>6}"
    print(header)
    for model_name in SPEED_MODELS:
        spec = (MODELS / model_name / "tokenizer.json").read_text(encoding="utf-8")
        ref = Reference(spec, False)
        engines = {}
        for n in names:
            try:
                engines[n] = ENGINES[n](spec, False)
            except Exception:  # shown as "-" in the table
                pass
        for kind, source in sources.items():
            for target in (1_000, 10_000, 100_000):
                text = text_of_tokens(ref.tok, source, target)
                tokens = ref.count(text, False)
                warmup = unseen_warmup(sources, kind)
                ref_cold = cold_cpu(lambda spec=spec: Reference(spec, False), text, args.cold, warmup)
                ref_warm, _, _ = timed(lambda ref=ref, text=text: ref.count(text, False), args.rounds)
                row = f"{model_name:34} {kind:7} {tokens:7d} {ref_cold * 1e3:9.2f} {ref_warm * 1e3:9.2f}"
                for n in names:
                    engine = engines.get(n)
                    if engine is None or engine.count(text, False) != tokens:
                        row += f" | {'-' if engine is None else 'differs':>15} {'':>6} {'':>7} {'':>6}"
                        continue
                    cold = cold_cpu(lambda n=n, spec=spec: ENGINES[n](spec, False), text, args.cold, warmup)
                    warm, _, _ = timed(lambda engine=engine, text=text: engine.count(text, False), args.rounds)
                    row += (f" | {cold * 1e3:15.2f} {cold / ref_cold:6.3f} {warm * 1e3:7.2f} "
                            f"{warm / ref_warm:6.3f}")
                print(row, flush=True)
    print()
    run_gil(args)


def run_gil(args: argparse.Namespace) -> None:
    names = args.engines
    sources = source_texts()
    print("GIL: progress of a pure-Python thread while each engine counts a 100k-token code text, "
          "relative to the thread alone (~1: GIL released, ~0: held)")
    spec = (MODELS / SPEED_MODELS[0] / "tokenizer.json").read_text(encoding="utf-8")
    ref = Reference(spec, False)
    text = text_of_tokens(ref.tok, sources["code"], 100_000)
    print(f"{'encode_batch_fast':20} {gil_share(lambda: ref.count(text, False)):.2f}")
    print(f"{'encode (reference)':20} {gil_share(lambda: ref.tok.encode(text, add_special_tokens=False)):.2f}")
    for n in names:
        try:
            engine = ENGINES[n](spec, False)
        except Exception:  # engines that cannot load have no row
            continue
        print(f"{n:20} {gil_share(lambda engine=engine: engine.count(text, False)):.2f}")
        pieces = [text[i:i + 2000] for i in range(0, len(text), 2000)]
        if hasattr(engine, "tok") and hasattr(engine.tok, "encode_batch"):
            share = gil_share(lambda engine=engine, pieces=pieces: engine.tok.encode_batch(pieces))
            print(f"{n + ' encode_batch':20} {share:.2f}")


def _stock_sandbox(model: Any) -> Any:
    """The model with its templates compiled in jinja's stock ImmutableSandboxedEnvironment
    (configured as transformers does): rendering as it was before the per-type safety table."""
    import copy
    import dataclasses

    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from tokenizer_cache import _jinja

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_jinja._GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _jinja._tojson
    env.globals.update(raise_exception=_jinja._raise_exception, strftime_now=_jinja._strftime_now)
    clone = copy.copy(model)
    clone._templates = {name: dataclasses.replace(t, compiled=env.from_string(t.source))
                        for name, t in model._templates.items()}
    return clone


def _chat_body(text: str) -> dict:
    return {"messages": [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": text}]}


def run_chat(args: argparse.Namespace) -> None:
    """count_chat on Qwen3-8B through brimful: the engine in use against tokenizers' encode_batch_fast."""
    from tokenizer_cache import PieceCountCache
    from tokenizer_cache._chat_cache import ChatCountCache
    from tokenizer_cache._encoder import ReferenceEncoder, select_encoder

    sources = source_texts()
    directory = MODELS / SPEED_MODELS[0]
    model = load_model_tokenizer(directory, engine="fastokens")  # the steady state of "auto"
    spec = (directory / "tokenizer.json").read_text(encoding="utf-8")
    print(f"count_chat on {SPEED_MODELS[0]} (template rendering included, no piece/chat cache), engine: "
          f"{model.engine}.  CPU ms of all threads.  ebf = encode_batch_fast of the same rendered text.")
    print(f"cold: first count of this text by a freshly loaded engine / Tokenizer that counted only 40k "
          f"characters of the other kinds (median of {args.cold}); warm: again, median of {args.rounds}")
    print(f"{'text':7} {'tokens':>7} {'ebf cold':>9} {'chat cold':>10} {'ratio':>6} | {'ebf warm':>9} "
          f"{'chat warm':>10} {'ratio':>6}")
    for kind in ("code", "prose", "korean"):
        for target in (800, 10_000, 100_000):
            text = text_of_tokens(model.tokenizer, sources[kind], target)
            body = _chat_body(text)
            rendered = model.render_chat(body)
            tokens = model.count_chat(body)
            assert tokens == len(model.tokenizer.encode(rendered, add_special_tokens=False))
            warmup = unseen_warmup(sources, kind)
            ebf_cold = cold_cpu(lambda spec=spec: Reference(spec, False), rendered, args.cold, warmup)
            chat_cold = []
            for _ in range(args.cold):
                # The loaded model with a freshly loaded engine of the same kind: no word of this text cached.
                fresh = model.with_encoder(select_encoder(model.tokenizer, spec, engine=model.engine))
                fresh.count_chat(_chat_body(warmup))
                gc.collect()
                start = time.process_time()
                fresh.count_chat(body)
                chat_cold.append(time.process_time() - start)
            ref = Reference(spec, False)
            ebf_warm, _, _ = timed(lambda ref=ref, rendered=rendered: ref.count(rendered, False), args.rounds)
            chat_warm, _, _ = timed(lambda model=model, body=body: model.count_chat(body), args.rounds)
            cold = statistics.median(chat_cold)
            print(f"{kind:7} {tokens:7d} {ebf_cold * 1e3:9.2f} {cold * 1e3:10.2f} {cold / ebf_cold:6.3f} | "
                  f"{ebf_warm * 1e3:9.2f} {chat_warm * 1e3:10.2f} {chat_warm / ebf_warm:6.3f}", flush=True)

    print()
    text = text_of_tokens(model.tokenizer, sources["prose"], 800)
    body = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                         {"role": "user", "content": text[: len(text) // 2]},
                         {"role": "assistant", "content": "Noted."},
                         {"role": "user", "content": text[len(text) // 2:]}]}
    size = len(json.dumps(body).encode())
    reference = model.with_encoder(ReferenceEncoder(model.tokenizer))
    pieces = PieceCountCache()
    rows = [
        ("before: tokenizers, stock sandbox, piece cache", _stock_sandbox(reference.with_piece_cache(pieces))),
        ("tokenizers, per-type sandbox table, piece cache", reference.with_piece_cache(pieces)),
        ("fastokens, per-type table, piece cache", model.with_piece_cache(pieces)),
        ("fastokens, per-type table, piece + chat cache",
         model.with_piece_cache(pieces).with_chat_cache(ChatCountCache())),
        ("tokenizers, stock sandbox, no piece/chat cache", _stock_sandbox(reference)),
        ("fastokens, per-type table, no piece/chat cache", model),
    ]
    print(f"one {size}-byte chat ({reference.count_chat(body)} tokens), the same body repeated: CPU us per "
          f"count_chat, median of {args.rounds} x 200 calls, ratio to the first row")
    base = None
    for label, counting in rows:
        counting.count_chat(body)

        def many(counting: Any = counting) -> None:
            for _ in range(200):
                counting.count_chat(body)

        cpu, _, _ = timed(many, args.rounds)
        us = cpu / 200 * 1e6
        base = base or us
        print(f"  {label:52} {us:8.1f} {us / base:6.2f}")


def run_rebuilt(args: argparse.Namespace) -> None:
    import tempfile

    sources = source_texts()
    for name in ("microsoft--Phi-3-mini-4k-instruct", "microsoft--Phi-3-medium-4k-instruct"):
        with tempfile.TemporaryDirectory() as tmp:
            folder = pathlib.Path(tmp)
            for file in ("tokenizer.json", "tokenizer_config.json"):
                (folder / file).symlink_to(MODELS / name / file)
            (folder / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
            before = load_model_tokenizer(folder, tokenizer_loader="transformers5", engine="tokenizers")
            after = load_model_tokenizer(folder, tokenizer_loader="transformers5", engine="fastokens")  # steady state
            print(f"\n{name} (transformers 5: {after.loader_info.tokenizer_class}); engine after: {after.engine}")
            print(f"  {'text':16} {'tokenizers ms':>14} {after.engine + ' ms':>14} {'ratio':>7}")
            for kind, source in sources.items():
                for target in (1_000, 10_000, 100_000):
                    text = text_of_tokens(before.tokenizer, source, target)
                    a = before.count_text(text, add_special_tokens=False)
                    b = after.count_text(text, add_special_tokens=False)
                    assert a == b, (name, kind, target, a, b)
                    old, new = (timed(lambda m=m, text=text: m.count_text(text, add_special_tokens=False),
                                      args.rounds)[0] for m in (before, after))
                    print(f"  {kind + ' ' + str(a):16} {old * 1e3:14.2f} {new * 1e3:14.2f} {old / new:6.1f}x",
                          flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["exactness", "speed", "gil", "chat", "rebuilt"])
    parser.add_argument("--random", type=int, default=3000, help="random texts per tokenizer (exactness)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--cold", type=int, default=3, help="fresh engine loads per cold figure (speed)")
    parser.add_argument("--engines", nargs="+", default=list(ENGINES))
    args = parser.parse_args(argv)
    {"exactness": run_exactness, "speed": run_speed, "gil": run_gil, "chat": run_chat,
     "rebuilt": run_rebuilt}[args.what](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
