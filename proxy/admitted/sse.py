"""Scanning a relayed event stream: usage, finish reasons, the end marker, in-stream errors.

The scanner sees the bytes as they are relayed and keeps what it learns in its
own fields (`usage`, `done`, `failed`, `last_data`); the exchange reads them when the
stream ends.  Only lines that can carry a value are JSON-parsed (the surface's
`may_carry_usage` is a name or substring test), so relaying costs a substring search
per chunk, not a parse.  Each `data:` line is judged with the `event:` name
that preceded it in its event (Responses and Anthropic Messages name every
event; OpenAI's chat streams name none).
"""

from __future__ import annotations

from proxy.admitted.surfaces import Surface, Usage, parse_json_payload

# A line that never ends is not buffered past this (its bytes are still relayed; the rest
# of it is not scanned).
MAX_LINE_BYTES = 4 * 1024 * 1024
# An event held back because it may be the usage-only one brimful asked for: vLLM's is a few
# hundred bytes, so an event longer than this is relayed as it arrives (issue 25: one 200 MB
# line without a newline was held whole, and joined again with every chunk).
MAX_HELD_EVENT = 64 * 1024


class EventStreamScanner:
    """Reads one surface's server-sent events as they pass through."""

    def __init__(self, surface: Surface) -> None:
        self.surface = surface
        self.usage = Usage()
        self.done = False           # the surface's end-of-stream event was seen
        self.failed = False         # the upstream sent an error event inside the stream
        self.at_boundary = True     # the bytes so far end between two events
        self.last_data = b""        # the payload of the last `data:` line seen
        self._event = b""           # the `event:` name of the event being read
        self._partial = b""
        self._skipping = False      # inside a line longer than MAX_LINE_BYTES: not scanned
        self._event_tail = b""
        self._passing = False       # inside an event too long to hold: relayed until its end
        self._ended_nl = False      # the last byte relayed in passing was a newline

    def feed(self, chunk: bytes) -> None:
        """Scan relayed bytes (any split: a line may span chunks)."""
        surface = self.surface
        boundary = chunk.endswith(b"\n\n")
        if self._skipping:
            cut = chunk.find(b"\n")
            if cut < 0:
                self.at_boundary = False
                return
            self._skipping = False
            data = chunk[cut + 1:]
        else:
            data = self._partial + chunk if self._partial else chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_LINE_BYTES:
            self._partial, self._skipping = b"", True
        self.at_boundary = boundary or data.endswith(b"\n\n")
        for line in lines:
            if not line.startswith(b"data:"):
                if line.startswith(b"event:"):
                    self._event = line[6:].strip()
                elif not line.strip():
                    self._event = b""      # a blank line ends the event
                continue
            payload = self.last_data = line[5:].strip()
            event = self._event
            if surface.is_stream_end(event, payload):
                self.done = True
                if surface.may_carry_usage(event, payload):
                    surface.read_usage(parse_json_payload(payload), self.usage)
            elif surface.is_stream_error(event, payload):
                self.failed = True
            elif surface.may_carry_usage(event, payload):
                surface.read_usage(parse_json_payload(payload), self.usage)

    def drop_usage_events(self, chunk: bytes) -> bytes:
        """The complete events in `chunk` minus the usage-only ones brimful asked for.

        Their numbers are kept in `usage`; bytes after the last complete event
        wait for the next chunk (or `leftover()`), so nothing waits longer than
        the end of the event it is in, and no event longer than MAX_HELD_EVENT
        waits at all: it cannot be the usage chunk, so it is relayed as it comes.
        """
        out: list[bytes] = []
        if self._passing:
            if self._ended_nl and chunk.startswith(b"\n"):
                end = 1                                  # the "\n\n" spans the two chunks
            else:
                found = chunk.find(b"\n\n")
                end = found + 2 if found >= 0 else -1
            if end < 0:
                self._ended_nl = chunk.endswith(b"\n")
                self.feed(chunk)
                return chunk
            out.append(chunk[:end])
            chunk, self._passing = chunk[end:], False
        data = self._event_tail + chunk if self._event_tail else chunk
        events = data.split(b"\n\n")
        self._event_tail = events.pop()
        for event in events:
            if self.surface.is_usage_only(event):
                self.surface.read_usage(parse_json_payload(event.partition(b"data:")[2]), self.usage)
                continue
            out.append(event + b"\n\n")
        if len(self._event_tail) > MAX_HELD_EVENT:
            out.append(self._event_tail)
            self._ended_nl = self._event_tail.endswith(b"\n")
            self._event_tail, self._passing = b"", True
        relayed = b"".join(out)
        if relayed:
            self.feed(relayed)
        return relayed

    def leftover(self) -> bytes:
        """Bytes after the last complete event (relayed as they are at the end)."""
        tail, self._event_tail = self._event_tail, b""
        if tail:
            self.feed(tail)
        return tail
