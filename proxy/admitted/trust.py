"""How far brimful's own prompt count of one model can be trusted, and what to do when it cannot.

A count is only worth clamping with if it is the upstream's count.  Two
witnesses say whether it is: the start-up parity probes (the same
conversations counted locally and by the upstream's `/tokenize`), and every
answer's usage (`prompt_tokens` as the upstream counted it).  `CountTrust`
keeps what they said for one model and decides, purely, how the next request
is counted:

* `local`: brimful's tokenizer, exact (the probes matched, or nothing ever
  contradicted it): no margin, and a prompt that cannot fit is refused;
* `upstream`: the probes differed, or live drift recurred, and the upstream
  has a `/tokenize`: count there (vLLM's own count), while the local count
  keeps running beside it; after `RECOVER_AFTER` agreements in a row (the
  cause was fixed: a template or tokenizer change) counting goes back to local;
* `margin`: drift recurred and nothing can count exactly: the local count,
  with the largest under-count seen held back, and no refusal on it; after
  `DRIFT_WINDOW` answers in a row without drift, local again.

State changes are logged once each (by the caller, from `transition`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["local", "upstream", "margin"]

DRIFT_WINDOW = 100       # recent requests the drift rule looks at
DRIFT_SWITCH = 2         # this many drifting requests among them: stop trusting the local count
RECOVER_AFTER = 100      # consecutive agreements of local and upstream counts to trust local again


@dataclass
class CountTrust:
    model: str
    parity: bool | None = None              # probes vs /tokenize: True matched, False differed, None not checked
    upstream_tokenize: bool = False         # the upstream answered /tokenize with a count
    mode: Mode = "local"
    reason: str | None = None               # why the mode is not "local"
    max_under: int = 0                      # most tokens brimful counted below the upstream
    max_over: int = 0                       # most tokens brimful counted above it
    under_now: int = 0                      # most counted below it since the count was last trusted
    drift_requests: int = 0                 # requests whose count differed, in all
    agreeing: int = 0                       # consecutive agreements while counting upstream
    _recent: deque[bool] = field(default_factory=lambda: deque(maxlen=DRIFT_WINDOW))

    @property
    def exact(self) -> bool:
        """The count the next request gets is the upstream's (no margin, refusals allowed)."""
        return self.mode != "margin"

    @property
    def margin(self) -> int:
        """Tokens to hold back when clamping: the under-count seen, when the count is not exact."""
        return 0 if self.exact else max(self.under_now, 1)

    def probes(self, matched: bool | None, *, by_tokenize: bool = True) -> str | None:
        """The start-up parity result; returns the change to log, if any.

        `by_tokenize`: the probes were compared with the upstream's /tokenize,
        which can then count for this model; False where /tokenize renders
        another prompt than the chat does (gpt-oss: harmony), so the probes
        were compared with the usage of one-token completions instead.
        """
        self.parity = matched
        if matched is None:
            return None
        self.upstream_tokenize = by_tokenize
        if matched:
            return None
        return self._distrust("its start-up probes differ from the upstream's /tokenize")

    def answered(self, counted: int, reported: int) -> str | None:
        """An answer's usage against the count brimful admitted it with."""
        drift = counted - reported
        self._recent.append(drift != 0)
        if drift == 0:
            if self.mode == "margin" and len(self._recent) == DRIFT_WINDOW and not any(self._recent):
                self.mode, self.reason, self.under_now = "local", None, 0
                return f"counting locally again: its last {DRIFT_WINDOW} answers reported the same count"
            return None
        self.drift_requests += 1
        self.max_under = max(self.max_under, -drift)
        self.max_over = max(self.max_over, drift)
        self.under_now = max(self.under_now, -drift)
        if self.mode == "upstream":
            # The upstream's /tokenize disagrees with its own usage (a renderer
            # /tokenize does not use): nothing counts exactly.
            self.mode, self.reason = "margin", "the upstream's /tokenize differs from its own usage"
            return f"counting with a margin of {self.margin} tokens: {self.reason}"
        if self.mode == "local" and sum(self._recent) >= DRIFT_SWITCH:
            return self._distrust(f"{sum(self._recent)} of its last {len(self._recent)} answers reported "
                                  "another prompt count")
        return None

    def shadow(self, local: int, upstream: int) -> str | None:
        """While counting upstream: the local count of the same request, beside it."""
        if self.mode != "upstream":
            return None
        if local != upstream:
            self.agreeing = 0
            return None
        self.agreeing += 1
        if self.agreeing < RECOVER_AFTER:
            return None
        self.mode, self.reason, self.agreeing, self.under_now = "local", None, 0, 0
        self._recent.clear()
        return f"counting locally again: {RECOVER_AFTER} requests in a row counted as the upstream counts them"

    def _distrust(self, why: str) -> str:
        self.agreeing = 0
        if self.upstream_tokenize:
            self.mode, self.reason = "upstream", why
            return f"counting through the upstream's /tokenize: {why}"
        self.mode, self.reason = "margin", why
        return f"counting with a margin of {self.margin} tokens (no /tokenize upstream): {why}"

    def describe(self) -> dict[str, object]:
        """For /stats: how this model is counted, and why."""
        return {"mode": self.mode, "exact": self.exact, "margin_tokens": self.margin, "reason": self.reason,
                "parity": self.parity, "drift_requests": self.drift_requests,
                "max_under_count": self.max_under, "max_over_count": self.max_over}
