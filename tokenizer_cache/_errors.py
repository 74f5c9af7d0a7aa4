"""The one exception the counter raises for a request vLLM would refuse."""

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
