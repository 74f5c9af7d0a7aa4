"""A non-streamed JSON answer too large to hold, scanned as it is relayed.

Answers up to `proxy.admitted.exchange`'s whole-answer limit are read whole, parsed and
checked (a 200 whose body is not JSON is a broken upstream, answered 502).  A
larger one (a 500 MB completion is possible) is relayed as it arrives, and
this scanner learns in bounded memory what the exchange needs from it:

* whether the bytes form one complete JSON value: brackets balanced outside
  strings, nothing after the end (a body cut short has open brackets);
* the `usage` object, decoded from the last `TAIL_BYTES` (vLLM puts it after
  the choices, so at the end of the answer);
* each `"finish_reason": "..."` key, found by a pattern that cannot match
  inside a string (quotes in JSON strings are escaped).

The scan is a few searches per chunk: string contents, the bulk of any
answer, are skipped by `bytes.find` (0.1 s of CPU for 500 MB, where a
regular expression over the string took 2.2 s).  Pure: bytes in, facts out.
"""

from __future__ import annotations

import json
import re
from typing import Any

TAIL_BYTES = 64 * 1024          # the end of the answer kept for its usage object
_OVERLAP = 64                   # a finish_reason key split between two chunks is still seen

_STRUCTURE = re.compile(rb'["{}\[\]]')
_SPACE = re.compile(rb"[ \t\r\n]*")
_FINISH = re.compile(rb'"finish_reason"[ \t\r\n]*:[ \t\r\n]*"([A-Za-z_]{1,40})"')
_USAGE = re.compile(rb'"usage"[ \t\r\n]*:[ \t\r\n]*(?=\{)')
_DECODER = json.JSONDecoder()


class AnswerScanner:
    """Feed every relayed chunk in order; then read `complete`, `usage()` and `finish_reasons`."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False          # the next byte of the current string is escaped
        self.started = False
        self.ended = False            # the top-level value closed
        self.broken = False           # bytes that cannot belong to one JSON value
        self.finish_reasons: list[str] = []
        self._tail = b""
        self._overlap = b""

    def feed(self, chunk: bytes) -> None:
        self._structure(chunk)
        window = self._overlap + chunk
        if b'"finish_reason"' in window:
            for match in _FINISH.finditer(window):
                if match.end() > len(self._overlap):      # not already counted in the last chunk
                    self.finish_reasons.append(match.group(1).decode("ascii"))
        self._overlap = window[-_OVERLAP:]
        self._tail = (self._tail + chunk)[-TAIL_BYTES:]

    @property
    def complete(self) -> bool:
        """The bytes so far are one whole JSON object or array (and nothing else)."""
        return self.started and self.ended and not self.broken and not self.in_string

    def usage(self) -> Any:
        """The answer's `usage` value (decoded from the tail), or None."""
        tail = self._tail
        for match in reversed(list(_USAGE.finditer(tail))):
            try:
                return _DECODER.raw_decode(tail[match.end():].decode("utf-8"))[0]
            except (ValueError, UnicodeDecodeError):
                continue
        return None

    def _structure(self, chunk: bytes) -> None:
        pos, size = 0, len(chunk)
        while pos < size and not self.broken:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                    pos += 1
                    continue
                end = _string_end(chunk, pos)
                if end < 0:                               # the string goes on in the next chunk
                    run = min(size - len(chunk.rstrip(b"\\")), size - pos)
                    self.escaped = run % 2 == 1
                    return
                self.in_string = False
                pos = end + 1
                continue
            if self.ended:
                space = _SPACE.match(chunk, pos)
                assert space is not None
                if space.end() < size:
                    self.broken = True                    # something after the value
                return
            if not self.started:
                space = _SPACE.match(chunk, pos)
                assert space is not None
                pos = space.end()
                if pos == size:
                    return
                if chunk[pos:pos + 1] not in (b"{", b"["):
                    self.broken = True
                    return
                self.started = True
            found = _STRUCTURE.search(chunk, pos)
            if found is None:
                return
            char = found.group()
            pos = found.end()
            if char == b'"':
                self.in_string = True
            elif char in (b"{", b"["):
                self.depth += 1
            else:
                self.depth -= 1
                if self.depth == 0:
                    self.ended = True
                elif self.depth < 0:
                    self.broken = True


def _string_end(chunk: bytes, start: int) -> int:
    """The offset of the quote that closes a string running from `start`, or -1.

    `bytes.find` (memchr) skips the text; a quote preceded by an odd run of
    backslashes is escaped and skipped too.
    """
    quote = chunk.find(b'"', start)
    while quote >= 0:
        before = quote
        while before > start and chunk[before - 1] == 0x5C:      # backslash
            before -= 1
        if (quote - before) % 2 == 0:
            return quote
        quote = chunk.find(b'"', quote + 1)
    return -1
