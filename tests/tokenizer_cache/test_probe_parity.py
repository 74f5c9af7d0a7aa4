"""The start-up parity probes find no drift on any shipped tokenizer, against vLLM 0.32's own tokenizer.

At start-up the proxy counts `PARITY_PROBES` (proxy/admitted/counting.py)
locally and asks the upstream's /tokenize; a mismatch moves the model to
/tokenize.  Here the reference is what vLLM would count, without a server:
vLLM 0.32's `get_tokenizer`, run in the real-vLLM venv
(tests/support/vllm_token_counts.py), encodes the prompt brimful renders for
each probe, and the probe texts themselves as completions prompts.  That is
exactly vLLM's count wherever brimful renders the template as vLLM does (the
corpora check the rendering against real servers); what this adds is the
tokenizer vLLM builds, for every tokenizer the project ships:

* the shared/models and npm tokenizers as vLLM meets them served by hub id:
  a Hugging Face cache snapshot with the official `model_type` (vLLM resolves
  the id offline from HF_HUB_CACHE, brimful reads the id from the snapshot
  path), so R1-Distill-Llama gets transformers' id rule;
* the tiny model folders the real-vLLM tier serves from a local path
  (tests/tokenizer_cache/test_loader_survey.py's SERVED; their weightless
  recipe where not built here), where transformers 5 rebuilds Phi-3 and
  R1-Distill-Llama as LlamaTokenizer.

brimful counts as the proxy does by default: loader auto, engine auto
(fastokens where it passes its self-check), a piece cache.  The image probe is
left out (the media corpora check image counts); mistral-common folders too
(mistral-common encodes on both sides).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from proxy.admitted.counting import PARITY_PROBES
from tests.realvllm.venv import READY_MARKER, default_venv_path, quiet_env, venv_python
from tests.tokenizer_cache.test_loader_survey import DRIFT_TEXTS, SERVED, SOURCES, _present, _served
from tokenizer_cache import CountError, PieceCountCache, load_model_tokenizer
from tokenizer_cache._selfcheck import FRAGMENTS

pytestmark = pytest.mark.slow  # one vLLM import (~10-30 s) and ~20 tokenizer loads

ROOT = Path(__file__).resolve().parents[2]
PROBES = {name: probe for name, probe in PARITY_PROBES.items() if name != "image"}
TEXTS = DRIFT_TEXTS + FRAGMENTS


def _snapshot(name: str, hub: Path) -> Path:
    """The tokenizer as a Hugging Face cache snapshot of its hub id, with its official model_type."""
    source = _present(name)
    assert source.folder is not None
    org, repo = source.hub_id.split("/")
    base = hub / f"models--{org}--{repo}"
    folder = base / "snapshots" / ("0" * 40)
    folder.mkdir(parents=True)
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("0" * 40)
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (source.folder / file).is_file():
            (folder / file).symlink_to(source.folder / file)
    (folder / "config.json").write_text(json.dumps({"model_type": source.model_type}), encoding="utf-8")
    return folder


def _brimful(folder: Path) -> tuple[list[str], list[int]]:
    """The texts vLLM is to count (each probe's rendered prompt, then TEXTS) and brimful's counts of them."""
    model = load_model_tokenizer(folder).with_piece_cache(PieceCountCache())
    texts, counts = [], []
    for probe in PROBES.values():
        try:
            counts.append(model.count_chat(probe))
        except CountError:
            continue  # the template refuses it: the probe compares refusals, not counts
        texts.append(model.render_chat(probe))
    texts += TEXTS
    counts += [model.count_text(text, add_special_tokens=False) for text in TEXTS]
    return texts, counts


def _vllm_counts(requests: list[dict[str, Any]], hub: Path) -> list[list[int]]:
    venv = default_venv_path()
    if not (venv / READY_MARKER).is_file():
        pytest.skip(f"no vLLM 0.32 venv at {venv} (tests/realvllm/venv.py prepares it)")
    env = {**quiet_env(), "HF_HUB_CACHE": str(hub), "HF_HOME": str(hub.parent / "hf-home")}
    done = subprocess.run([str(venv_python(venv)), str(ROOT / "tests" / "support" / "vllm_token_counts.py")],
                          input=json.dumps(requests), capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    answer: list[list[int]] = json.loads(done.stdout)
    return answer


def test_the_probes_find_no_drift_on_any_shipped_tokenizer(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    models: dict[str, tuple[str, Path]] = {}  # label -> (what vLLM is started with, folder brimful loads)
    for name in SOURCES:
        models[name] = (SOURCES[name].hub_id, _snapshot(name, hub))
    for rel in SERVED:
        folder = _served(rel, tmp_path / "served")
        models[rel] = (str(folder), folder)
    ours = {label: _brimful(folder) for label, (_, folder) in models.items()}
    theirs = _vllm_counts([{"model": served, "texts": ours[label][0]} for label, (served, _) in models.items()], hub)
    drift = {}
    for (label, (texts, counts)), reference in zip(ours.items(), theirs, strict=True):
        differing = [(text[:60], mine, vllm) for text, mine, vllm in zip(texts, counts, reference, strict=True)
                     if mine != vllm]
        if differing:
            drift[label] = differing
    assert drift == {}
