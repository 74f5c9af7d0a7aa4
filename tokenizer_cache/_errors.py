"""The two exceptions counting raises: a request vLLM would refuse, and media brimful cannot count."""

from __future__ import annotations


class CountError(Exception):
    """The request is one vLLM would reject with HTTP 400 while rendering or tokenizing it.

    `message` is user-facing (it may quote the chat template's own message, as
    vLLM does); `param` names the request field at fault when one is known.
    The proxy turns this into its own 400 instead of forwarding a request that
    cannot be counted.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __repr__(self) -> str:
        return f"CountError({self.message!r}, param={self.param!r})"


class MediaNotCountable(Exception):
    """The request carries media whose prompt tokens brimful cannot reproduce.

    Not a `CountError`: nothing says vLLM would refuse the request, so it must
    never become a 400.  The caller forwards it without a clamp (or asks the
    upstream, whose `/tokenize` runs the multimodal processor in vLLM 0.32).

    `reason` is a short machine-readable word for records and metrics:
    ``remote_url`` (http(s)/file URL, not fetched), ``model`` (no multimodal
    arithmetic for this model), ``modality`` (audio, video, embeddings the
    model's arithmetic does not cover), ``image_format`` (a format vLLM may
    open whose header brimful does not read), ``kwargs`` (request-level
    processor options brimful does not reproduce), ``placeholders`` (the
    prompt's placeholder tokens do not line up with the media items).
    `where` names the content part (``messages[0].content[1]``) when known.
    The message names neither URLs nor prompt text.
    """

    def __init__(self, message: str, *, reason: str, where: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.where = where

    def __repr__(self) -> str:
        return f"MediaNotCountable({self.message!r}, reason={self.reason!r}, where={self.where!r})"
