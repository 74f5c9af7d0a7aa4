"""Which templates' message loops `_loop_proof` proves, and each rule that refuses one.

A refused template is rendered whole as before, so refusing is always safe;
proving one whose iterations read something the hooks do not see would make a
skipped turn render stale text.  Each refusal below is a template built to
read such an input.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.families import FAMILIES, family_folder
from tokenizer_cache import ModelTokenizer, TokenizerCache
from tokenizer_cache._loop_proof import NotProven, prove_loop

LOOP = "{% for message in messages %}<{{ message.role }}>{{ message.content }}{% endfor %}"


def test_every_family_template_of_the_corpora_is_proven(tmp_path: Path) -> None:
    cache = TokenizerCache(piece_cache_entries=0, chat_cache_entries=0)
    proven = 0
    for name in FAMILIES:
        folder = family_folder(name, tmp_path)
        if isinstance(folder, str):
            continue
        model = cache.get(folder)
        if isinstance(model, ModelTokenizer) and model.family == "hf":
            for template in model._templates.values():
                assert template.loop_proof is not None, (name, template.name)
                proven += 1
    assert proven >= 5


@pytest.mark.parametrize("source", [
    LOOP,
    "{% set ns = namespace(n=0) %}{% for m in messages %}{{ ns.n }}{% set ns.n = ns.n + 1 %}{% endfor %}",
    "{% for m in messages %}{% if loop.last %}!{% endif %}{{ messages[loop.index0 - 1].role }}{% endfor %}",
    "{% set rest = messages[1:] %}{% for m in rest %}{{ loop.nextitem.role if loop.nextitem }}{% endfor %}",
    "{% macro show(m) %}{{ m.content }}{% endmacro %}{% for m in messages %}{{ show(m) }}{% endfor %}",
    "{% for m in messages %}{{ messages | length }}{% for c in m.content %}{{ loop.first }}{% endfor %}{% endfor %}",
])
def test_loops_whose_inputs_the_hooks_see_are_proven(source: str) -> None:
    assert prove_loop(source).template is not None


@pytest.mark.parametrize(("source", "why"), [
    ("no loop at all", "no loop"),
    ("{% for m in messages %}{{ m }}{% else %}none{% endfor %}", "else block"),
    ("{% for m in messages if m.role %}{{ m }}{% endfor %}", "filter"),
    ("{% for m in messages %}{{ m }}{% if m.stop %}{% break %}{% endif %}{% endfor %}", "break"),
    ("{% for m in messages %}{{ loop.cycle('a', 'b') }}{% endfor %}", "loop"),
    ("{% for m in messages %}{{ loop.changed(m.role) }}{% endfor %}", "loop"),
    ("{% macro f(l) %}{{ l.index }}{% endmacro %}{% for m in messages %}{{ f(loop) }}{% endfor %}", "loop"),
    ("{% for m in messages %}{{ messages | map(attribute='role') | join }}{% endfor %}", "message list"),
    ("{% for m in messages %}{{ messages[1:] | length }}{% endfor %}", "message list"),
    ("{% for m in messages %}{% for o in messages %}{{ o.role }}{% endfor %}{% endfor %}", "message list"),
    ("{% set ns = namespace(a=1) %}{% for m in messages %}{{ ns | attr('a') }}{% endfor %}", "namespace"),
    ("{% set ns = namespace(a=1) %}{% set ns = 2 %}{% for m in messages %}{{ ns.a }}{% endfor %}",
     "namespace and to something else"),
    ("{% set ns = namespace(a=1) %}{% for m in messages %}{% set ns = namespace() %}{{ ns.a }}{% endfor %}",
     "bound inside"),
    ("{% for m in messages %}{% set messages = [] %}{{ m }}{% endfor %}", "bound inside"),
    ("{% for m in messages %}{{ strftime_now('%Y') }}{% endfor %}", "function of its inputs"),
    ("{% for m in messages %}{{ [1, 2] | random }}{% endfor %}", "function of its inputs"),
    ("{% include 'x' %}" + LOOP, "includes"),
    ("{% for m in messages %}{{ brimful_memo_enter }}{% endfor %}", "brimful_memo_"),
])
def test_loops_with_an_input_the_hooks_miss_are_refused(source: str, why: str) -> None:
    with pytest.raises(NotProven, match=why):
        prove_loop(source)
