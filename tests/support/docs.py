"""The documentation as the tests read it: README.md and docs/*.md, their fenced blocks and links.

An example may appear on more than one page (the README's tour repeats two of docs/sizing.md's);
`block` finds every copy and insists they are the same, so one test run covers them all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DOCS: dict[str, str] = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in PAGES}


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string (``python``, ``yaml`` or empty), its lines."""

    doc: str
    line: int
    info: str
    lines: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def fenced_blocks(doc: str, text: str) -> list[Block]:
    lines = text.split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            found.append(Block(doc, i + 1, lines[i][3:].strip(), tuple(lines[i + 1:end])))
            i = end + 1
        else:
            i += 1
    return found


BLOCKS: list[Block] = [b for doc, text in DOCS.items() for b in fenced_blocks(doc, text)]


def blocks_with(text: str) -> list[Block]:
    """Every block whose text contains `text` (a line's start: begin `text` with a newline)."""
    return [b for b in BLOCKS if text in "\n" + b.text]


def block(text: str) -> list[str]:
    """The lines of the one example containing `text`, wherever it is shown (all copies equal)."""
    found = blocks_with(text)
    assert found, f"no block in README.md or docs/ contains {text!r}"
    assert len({b.lines for b in found}) == 1, f"copies of {text!r} differ: {[(b.doc, b.line) for b in found]}"
    return list(found[0].lines)


def block_after(marker: str) -> list[str]:
    """Lines of the example whose first line contains `marker`."""
    found = [b for b in BLOCKS if b.lines and marker in b.lines[0]]
    assert found, f"no block in README.md or docs/ starts with {marker!r}"
    assert len({b.lines for b in found}) == 1, f"blocks starting {marker!r} differ: {[(b.doc, b.line) for b in found]}"
    return list(found[0].lines)


def python_block(marker: str) -> str:
    """The source of the one ```python block containing `marker`."""
    found = {b.text for b in BLOCKS if b.info == "python" and marker in b.text}
    assert len(found) == 1, f"{len(found)} different python blocks contain {marker!r}"
    return found.pop()


def between(doc: str, start: str, end: str) -> str:
    """The text of `doc` between two markers (the README's run/test command comments)."""
    text = DOCS[doc]
    return text[text.index(start) + len(start):text.index(end)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a page's headings make (outside fenced blocks), numbered when repeated as GitHub does."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    fence = False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"^#+ (.*)$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def prose(text: str) -> str:
    """A page without its fenced blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
