"""Media URLs as vLLM 0.32 reads them, and random access into a base64 payload.

vLLM (`MediaConnector.load_from_url`, vllm/multimodal/media/connector.py)
takes ``data:`` URLs (prefix matched case-insensitively), ``http(s)://``
URLs (fetched) and ``file://`` URLs (only with --allowed-local-media-path);
anything else is a 400 "The URL must be either a HTTP, data or file URL.".
A data URL is split at its first ``,``; the part before it must end in
``;base64`` (exactly, else 501 "Only base64 data URLs are supported for
now."), and the payload is decoded with ``pybase64.b64decode(validate=True)``:
one non-alphabet character anywhere, whitespace included, or a length that
is not a multiple of four is a 400 "Non-base64 digit found".

brimful never decodes a whole payload: base64 maps every 4 characters to 3
bytes, so any byte range can be decoded on its own, and an image header
reader skips over the pixel data without touching it (`Base64Bytes.read`).
"""

from __future__ import annotations

import binascii

from ._errors import CountError, MediaNotCountable

# vLLM's texts (vllm/multimodal/media/connector.py, pybase64).
NON_BASE64 = "Non-base64 digit found"
BAD_SCHEME = "The URL must be either a HTTP, data or file URL."


class Base64Bytes:
    """The bytes a base64 text decodes to, decoded piecewise on demand.

    The text is `source[start:]`, kept as the caller's string so a large data
    URL is never copied.
    """

    __slots__ = ("_source", "_start", "size")

    def __init__(self, source: str, start: int = 0) -> None:
        self._source = source
        self._start = start
        length = len(source) - start
        padding = (length >= 1 and source.endswith("=")) + (length >= 2 and source.endswith("=="))
        self.size = length // 4 * 3 - padding  # the length was checked to be a multiple of 4

    def read(self, offset: int, count: int) -> bytes:
        """Up to `count` bytes from `offset` (fewer at the end); raises CountError on
        a character vLLM's strict decoder would refuse."""
        if count <= 0 or offset >= self.size:
            return b""
        first = offset // 3
        last = min((offset + count + 2) // 3, (len(self._source) - self._start) // 4)
        chunk = self._source[self._start + first * 4 : self._start + last * 4]
        try:
            data = binascii.a2b_base64(chunk, strict_mode=True)
        except (binascii.Error, ValueError):
            raise CountError(NON_BASE64, param="messages") from None
        start = offset - first * 3
        return data[start : start + count]


def open_media_url(url: str, where: str) -> Base64Bytes:
    """The payload of a base64 data URL; other URLs are not read.

    Raises CountError where vLLM answers 400 for the URL itself, and
    MediaNotCountable for URLs vLLM would fetch (http(s), file) and for
    non-base64 data URLs (vLLM answers 501 for those: let it say so).
    """
    if url[:5].lower() == "data:":
        comma = url.find(",", 5)
        if comma < 0:
            raise CountError(f"Invalid data URL {url[:32]!r}: missing ',' separator.", param="messages")
        _media_type, semicolon, encoding = url[5:comma].rpartition(";")
        if not semicolon or encoding != "base64":
            raise MediaNotCountable(
                f"'{where}' is a data URL that is not base64; vLLM refuses it with 501.",
                reason="image_format",
                where=where,
            )
        if (len(url) - comma - 1) % 4:
            raise CountError(NON_BASE64, param="messages")
        return Base64Bytes(url, comma + 1)
    scheme = url.partition(":")[0].lower() if ":" in url else ""
    if scheme.startswith("http") or scheme == "file":
        raise MediaNotCountable(
            f"'{where}' is a {scheme} URL; brimful does not fetch media, so it cannot count it.",
            reason="remote_url",
            where=where,
        )
    raise CountError(BAD_SCHEME, param="messages")
