"""One admitted request, from the client's bytes to its length record.

`AdmittedExchange.run()` reads as the flow it is:

    prepare   read the body (bounded), parse it once, resolve the model and its
              max_model_len, take a back-pressure slot (proxy.upstream.gate; counting
              is work for the upstream's requests, so it waits its turn too),
              count the prompt, decide (proxy.admitted.admission, pure), rewrite only
              the limit fields the decision changes
    forward   send, holding the slot to the last byte; if the upstream refuses
              for length, retry once with the limit its own numbers allow
              (proxy.admitted.admission.retry_limit, pure)
    relay     the answer as it arrives: whole, or streamed event by event,
              mapping upstream failures to explained errors
    finish    latency, the drift warning, and the record to the recorder

The request is read once by its surface into an `AdmittedRequest`; the count,
the decision and the `Outcome` of forwarding it are values, and `finish` builds
the one `LengthRecord` from them (`proxy.admitted.request.length_record`).
What differs between API surfaces (where the prompt and the limit are, error
and event shapes, usage) is asked of its `proxy.admitted.surfaces.Surface`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from proxy import errors
from proxy.admitted import codex, jsonbody, trimming
from proxy.admitted.admission import Decision, completion_floor, decide_uncounted, retry_limit
from proxy.admitted.answer import AnswerScanner
from proxy.admitted.counting import Count, PromptCounter
from proxy.admitted.request import AdmittedRequest, Counted, Outcome, length_record
from proxy.admitted.sse import EventStreamScanner
from proxy.admitted.surfaces import Surface, Usage, parse_json_payload
from proxy.admitted.trust import CountTrust
from proxy.asgi import (
    ClientGone,
    Headers,
    Receive,
    Scope,
    Send,
    is_shutdown_deadline,
    path_qs,
    read_body,
    request_id,
    send_chunk,
    send_start,
    send_whole,
    until_disconnect,
)
from proxy.config import Config, Policy
from proxy.errors import BrimfulError, ErrorCode
from proxy.recording.record import Action
from proxy.recording.recorder import Recorder
from proxy.sizing.lengths import IMPLICIT_MAX_TOKENS, plausible_usage
from proxy.upstream.backends import Backend, Backends
from proxy.upstream.client import (
    DROP_ADMITTED,
    DROP_REQUEST_ID,
    Upstream,
    UpstreamResponse,
    access_control,
    client_headers,
    forwardable,
)
from proxy.upstream.explain import explain_upstream_error
from proxy.upstream.failure import UpstreamFailure, parse_upstream_error
from proxy.upstream.pools import choose_pool

log = logging.getLogger("brimful")

MAX_ERROR_BODY = 1024 * 1024      # how much of an upstream error body is read
# A non-streamed answer up to this size is read whole, checked and parsed; a
# larger one is relayed as it arrives (`relay_large`), so its size never
# becomes brimful's memory (a 500 MB answer peaked at 1,130 MiB when held).
MAX_WHOLE_ANSWER = 1024 * 1024
# An upstream's refusals for length (proxy.upstream.failure): a larger pool may take the request.
_LENGTH_KINDS = frozenset({"context_length", "prompt_too_long"})


@dataclass
class ExchangeServices:
    """What every admitted exchange shares: made once by the app."""

    config: Config
    backends: Backends
    counter: PromptCounter
    recorder: Recorder
    policy_for: Callable[[str | None], Policy]


class AdmittedExchange:
    def __init__(self, services: ExchangeServices, surface: Surface, scope: Scope, receive: Receive,
                 send: Send) -> None:
        self.services = services
        self.surface = surface
        self.scope = scope
        self.receive = receive
        self.send = send
        self.arrived = time.time()
        self.started = time.perf_counter()
        self.request_id = request_id(scope)
        self.info: Headers = []            # the x-brimful-* headers every answer carries
        # Set by prepare():
        self.request: AdmittedRequest | None = None   # the request, read once by its surface
        self.model: str | None = None                 # the served model it resolved to
        self.max_model_len: int | None = None
        self.counted = Counted()
        self.counted_under: CountTrust | None = None   # the model's count trust as the prompt was counted
        self.decision: Decision | None = None
        self.outgoing = b""                # what is sent upstream (the client's bytes unless rewritten)
        self.changes: dict[str, Any] = {}  # the fields rewritten
        self.limit_fields: list[str] = []  # the completion-limit fields a retry rewrites
        self.strip_usage = False           # brimful asked for the stream's usage: remove it again
        self.trim_changes: dict[str, Any] = {}  # the conversation (and Responses' truncation) as trimmed
        self.truncation_auto = False           # Responses' truncation "auto", done here
        self.unconfirmed_refusal: BrimfulError | None = None   # answered if the upstream refuses for length
        self.per_prompt: list[int] = []        # the counts decided on, one per prompt
        self.trimmed: tuple[int, int] | None = None   # (messages, tokens) dropped
        self.backend: Backend | None = None
        self.holds_slot = False            # one of the backend's gate slots is taken
        self.pools: list[tuple[Backend, int]] = []   # the model's pools by window (proxy.upstream.pools)
        self.pool = 0                      # the index in pools of self.backend
        # Set as the request is forwarded and answered:
        self.outcome = Outcome()

    async def run(self) -> None:
        try:
            try:
                await self.prepare()
            except ClientGone:
                log.debug("client left before sending the whole body of %s", self.scope["path"])
                return
            except BrimfulError as err:
                if not self.info:
                    self.info = [(b"x-brimful-action", Action.REJECTED.encode()),
                                 (b"x-request-id", self.request_id.encode())]
                await self.answer_error(err, Action.REJECTED if err.status < 500 else Action.UPSTREAM_ERROR)
                self.finish()
                return
            try:
                # A client that leaves once it has the stream's last event got the whole answer
                # (Codex closes on `response.completed`; vLLM may end the body milliseconds later).
                if await until_disconnect(self.receive, self.forward_and_relay()) and not self.outcome.delivered:
                    self.outcome.error_code = ErrorCode.CLIENT_DISCONNECTED
            except asyncio.CancelledError as exc:
                if not is_shutdown_deadline(exc):
                    raise
                # SIGTERM's drain deadline passed while this request waited for its answer.
                await self.answer_shutdown()
            self.finish()
        finally:
            if self.holds_slot:
                assert self.backend is not None
                self.backend.gate.release()

    # -- prepare ----------------------------------------------------------------------

    async def prepare(self) -> None:
        services, surface = self.services, self.surface
        body = await read_body(self.receive, services.config.server.max_body_bytes, self.scope)
        request = self.request = surface.read(body, jsonbody.parse_object(body))
        model, self.backend = await services.backends.resolve(request.fields.get("model"), unlisted=True)
        if services.backends.for_model(model) is None:
            # A name no upstream lists, left to the first upstream's vLLM: forwarded untouched, and
            # recorded under no model (any client may send any name; the per-model tables are bounded).
            await self.backend.gate.acquire()
            self.holds_slot = True
            decision = self.decision = Decision(Action.PASS, request.limit.value, request.limit.value)
        elif pools := services.backends.pools(model):
            self.model, self.pools = model, pools
            await services.counter.probed(model)
            decision = self.decision = await self.route(request, model)
        else:
            self.model = model
            await services.counter.probed(model)
            await self.backend.gate.acquire()      # 503 upstream_busy when no slot frees in time
            self.holds_slot = True
            info = self.backend.registry.get(model)
            self.max_model_len = info.max_model_len if info else None
            decision = self.decision = await self.decide(request, model, self.max_model_len)
        if decision.error is not None and surface.window_may_be_wider and decision.action == Action.REJECTED:
            # The upstream's pooler config may take inputs longer than its card's window: the
            # refusal stands only if the upstream refuses for length too (`forward`).
            self.unconfirmed_refusal = decision.error
            decision = self.decision = Decision(Action.PASS, None)
        counted = self.counted
        self.info = brimful_headers(counted.prompt_tokens, self.max_model_len, decision, self.request_id,
                                     counted.source)
        if counted.uncounted is not None:
            self.info.append((b"x-brimful-uncounted", counted.uncounted.encode()))
        if counted.trimmed_messages:
            self.info += [(b"x-brimful-trimmed-messages", str(counted.trimmed_messages).encode()),
                          (b"x-brimful-trimmed-tokens", str(counted.trimmed_tokens).encode())]
        if decision.error is not None:
            raise decision.error
        assert self.request is not None
        request = self.request      # its fields as trimmed, if they were
        self.changes = {**self.trim_changes, **(decision.rewrite or {})}
        surface.follow_limit(request.fields, self.changes)
        self.limit_fields = list(decision.rewrite) if decision.rewrite else request.limit.fields_to_set()
        self.strip_usage = (
            request.stream and services.config.upstream.request_stream_usage
            and surface.ask_for_usage(request.fields, self.changes)
        )
        self.outgoing = jsonbody.with_fields(body, request.fields, self.changes) if self.changes else body

    async def route(self, request: AdmittedRequest, model: str) -> Decision:
        """Pools: decide against the longest window, then take a slot of the smallest pool that holds it."""
        self.backend, longest = self.pools[-1]
        self.max_model_len = longest
        decision = await self.decide(request, model, longest)
        counted = self.counted
        prompt = counted.longest_prompt_tokens if counted.longest_prompt_tokens is not None else counted.prompt_tokens
        # nothing set: the surface's implicit limit (vLLM's 16 on /v1/completions), else the whole room
        granted = decision.granted if decision.granted is not None else IMPLICIT_MAX_TOKENS.get(self.surface.name)
        self.pool = choose_pool([w for _, w in self.pools], prompt if decision.error is None else None, granted)
        self.backend, window = self.pools[self.pool]
        self.services.recorder.count_pool_route(model, self.backend.name, window)
        await self.backend.gate.acquire()
        self.holds_slot = True
        return decision

    async def decide(self, request: AdmittedRequest, model: str, max_model_len: int | None) -> Decision:
        """Count the prompt and decide (the surface's rule, proxy.admitted.admission): pass, clamp, refuse, cut
        pooling inputs, or forward uncounted."""
        services, surface, limit = self.services, self.surface, request.limit
        if max_model_len is None:
            # No limit known (a config-less model whose card lacks one): relay untouched.
            return Decision(Action.PASS, limit.value, limit.value)
        if request.stored is not None:
            # The prompt lives upstream (a stored conversation): nothing here can count it.
            self.counted = Counted(uncounted=request.stored)
            return decide_uncounted(limit, max_model_len)
        policy = services.policy_for(model)
        strategy = self.trim_strategy(request, policy)
        # Its usage may move only this trust: a list change meanwhile (another server) starts a new one.
        self.counted_under = services.counter.trust(model)
        # A conversation to trim may be over vLLM's character bound until it is trimmed; a window
        # the upstream may widen has a bound brimful does not know.
        bound_by = None if strategy or surface.window_may_be_wider else max_model_len
        count = await services.counter.count(model, surface, request.fields, len(request.body), bound_by)
        if count.uncounted is not None:
            self.counted = Counted(uncounted=count.uncounted)
            return decide_uncounted(limit, max_model_len)
        if strategy is not None:
            count = await self.trim(request, model, strategy, count, policy, max_model_len)
            request = self.request = replace(request, fields={**request.fields, **self.trim_changes})
        self.per_prompt = count.per_prompt
        decision = surface.decide(request.fields, count.per_prompt, max_model_len, limit,
                                  policy, model=model, count_exact=count.exact,
                                  drift_margin=count.margin)
        if self.trimmed is not None and decision.error is None:
            decision = replace(decision, action=Action.TRIMMED)
        longest = max(count.per_prompt) if len(count.per_prompt) > 1 else None
        if decision.counted is not None and longest is not None:
            longest = min(longest, max_model_len)   # the upstream will see the prompts cut to what it keeps
        self.counted = Counted(
            prompt_tokens=decision.counted if decision.counted is not None else count.total,
            longest_prompt_tokens=longest, prompts=len(count.per_prompt),
            source=count.source if count.exact else "margin",
            trimmed_messages=self.trimmed[0] if self.trimmed else None,
            trimmed_tokens=self.trimmed[1] if self.trimmed else None,
            # Only an answer whose usage must equal this count (nothing cut, by the client or
            # by brimful) is a witness of the count's trust, which every client's requests share.
            trusted_usage=decision.counted is None and surface.usage_must_match(request.fields),
        )
        return decision

    def trim_strategy(self, request: AdmittedRequest, policy: Policy) -> trimming.Strategy | None:
        """The trimming asked for: the x-brimful-trim header, else the model's `trim`, else
        Responses' own `truncation: "auto"` (OpenAI's: whole items from the start)."""
        if self.surface.name not in ("chat", "messages", "responses"):
            return None
        header = next((v for k, v in self.scope["headers"] if k == trimming.HEADER), None)
        try:
            strategy = trimming.requested_strategy(header, policy.trim)
        except ValueError:
            raise errors.invalid_field("x-brimful-trim", "must be oldest, middle or off",
                                       header.decode("latin-1") if header else None) from None
        if strategy is None and self.surface.name == "responses" and request.fields.get("truncation") == "auto":
            self.truncation_auto = True
            return "oldest"
        return strategy

    async def trim(self, request: AdmittedRequest, model: str, strategy: trimming.Strategy, count: Count,
                   policy: Policy, max_model_len: int) -> Count:
        """Drop the fewest whole turns that make the prompt fit with its completion (at least the
        floor), each candidate counted exactly; the count of what is forwarded (`trim_changes`
        holds the fields to rewrite)."""
        limit = request.limit.value
        needed = completion_floor(policy.floor(self.surface.name), max_model_len)
        needed = min(limit, needed) if limit is not None else needed
        if not count.exact or len(count.per_prompt) != 1:
            return count
        plan = trimming.plan(self.surface.name, request.fields, strategy, keep_first_user=not self.truncation_auto)
        if count.total + needed > max_model_len and plan is not None:
            found = await self.fewest_drops(request, model, plan, needed, max_model_len)
            if found is not None:
                k, kept, after = found
                self.trimmed = (plan.items_dropped(k), count.total - after.total)
                self.trim_changes[plan.field] = kept
                count = after
        if self.truncation_auto and count.total + needed <= max_model_len:
            # brimful made it fit (or it did): vLLM's token cut would split messages, and harmony
            # models (gpt-oss) answer 400 for it.
            self.trim_changes["truncation"] = "disabled"
        return count

    async def fewest_drops(self, request: AdmittedRequest, model: str, plan: trimming.Plan, needed: int,
                           max_model_len: int) -> tuple[int, list[Any], Count] | None:
        """Binary search for the fewest units (in the plan's order) whose dropping fits: dropping
        more never adds tokens; a candidate the template refuses counts as not fitting. None when
        dropping every droppable unit is still too long (or refused)."""
        counter, surface, items = self.services.counter, self.surface, request.fields[plan.field]

        async def attempt(k: int) -> tuple[list[Any], Count | None]:
            """The conversation without k units, and its count (None: the template, or the upstream's
            /tokenize counting for it, refused it)."""
            kept = plan.without(items, k)
            try:
                counted = await counter.count(model, surface, {**request.fields, plan.field: kept},
                                              len(request.body))
            except errors.BrimfulError as refused:
                if refused.status >= 500:
                    raise
                return kept, None
            return kept, (None if counted.uncounted is not None else counted)

        lo, hi = 1, len(plan.order)
        kept, counted = await attempt(hi)
        if counted is None or counted.total + needed > max_model_len:
            return None
        best = (hi, kept, counted)
        while lo < hi:
            mid = (lo + hi) // 2
            kept, candidate = await attempt(mid)
            if candidate is not None and candidate.total + needed <= max_model_len:
                hi, best = mid, (mid, kept, candidate)
            else:
                lo = mid + 1
        return best

    # -- forward ------------------------------------------------------------------------

    async def forward_and_relay(self) -> None:
        response = await self.forward()
        if response is not None:
            await self.relay(response)

    async def forward(self) -> UpstreamResponse | None:
        """Send the request; at most one retry after a length refusal.  None: an error was answered."""
        assert self.backend is not None
        upstream = self.backend.upstream
        headers = forwardable(self.scope["headers"], DROP_ADMITTED)
        headers.append((b"x-request-id", self.request_id.encode()))
        retried = False
        while True:
            try:
                response = await upstream.send("POST", path_qs(self.scope), headers, self.outgoing)
                if response.status < 400:
                    return response
                raw = await upstream.read_body(response, MAX_ERROR_BODY)
            except BrimfulError as broken:
                await self.answer_error(broken, Action.UPSTREAM_ERROR)
                return None
            failure = parse_upstream_error(response.status, raw, response.headers.get("content-type"))
            if failure.kind in _LENGTH_KINDS and self.pool < len(self.pools) - 1:
                try:
                    upstream = await self.fall_back()
                except BrimfulError as busy:      # the larger pool's gate: 503 upstream_busy
                    await self.answer_error(busy, Action.UPSTREAM_ERROR)
                    return None
                continue
            # vLLM's CORS middleware (--allowed-origins) allowed the browser to read its answer: an
            # answer built from it must stay readable (a retry's answer brings its own headers).
            cors = access_control(response.raw_headers)
            confirmed = self.confirmed_refusal(failure) if failure.kind in _LENGTH_KINDS else None
            if confirmed is not None:
                self.info += cors
                await self.answer_error(confirmed, Action.REJECTED)
                return None
            corrected = None if retried else retry_limit(
                failure, prompt_tokens=self.counted.prompt_tokens, max_model_len=self.max_model_len,
                granted_max_tokens=self.granted_max_tokens,
            )
            if corrected is not None:
                log.warning(
                    "upstream rejected a clamped request of model %s for length; retrying with %d",
                    self.model, corrected,
                )
                retried = True
                self.retry_with(corrected)
                continue
            if failure.kind == "not_found" and "model" in failure.message.lower() and self.model is None:
                # A name no upstream lists, which this vLLM does not serve either: the 404 names
                # every upstream's models, in vLLM's words.
                asked = self.request.fields.get("model") if self.request else None
                self.info += cors
                await self.answer_error(errors.model_not_found(str(asked), self.services.backends.names),
                                        Action.REJECTED)
                return None
            err = explain_upstream_error(
                failure,
                upstream=upstream.public_url,
                prompt_tokens=self.counted.prompt_tokens,
                max_model_len=self.max_model_len,
                requested_max_tokens=self.request.limit.value if self.request else None,
                granted_max_tokens=self.granted_max_tokens,
                prompt_param=self.surface.prompt_param,
                max_tokens_param=self.limit_fields[0],
                surface=self.surface.name,
            )
            self.info += cors
            await self.answer_error(err, Action.UPSTREAM_ERROR)
            return None

    def confirmed_refusal(self, failure: UpstreamFailure) -> BrimfulError | None:
        """brimful's own refusal, held back (`unconfirmed_refusal`), now that the upstream refused for
        length too: worked out again with the window the upstream names (its pooler's, not the card's);
        None when nothing was held back, or nothing is too long for that window (then the upstream's
        own words explain it)."""
        held, window = self.unconfirmed_refusal, failure.max_model_len
        if held is None or window is None or window == self.max_model_len:
            return held
        assert self.request is not None and self.model is not None
        again = self.surface.decide(self.request.fields, self.per_prompt, window, self.request.limit,
                                    self.services.policy_for(self.model), model=self.model,
                                    count_exact=True, drift_margin=0)
        return again.error

    @property
    def granted_max_tokens(self) -> int | None:
        """The completion limit forwarded: the decision's, or the retry's."""
        if self.outcome.granted_max_tokens is not None:
            return self.outcome.granted_max_tokens
        return self.decision.granted if self.decision is not None else None

    async def fall_back(self) -> Upstream:
        """The pool refused for length: move the request (and its gate slot) to the next larger pool."""
        assert self.backend is not None and self.model is not None
        before = self.backend
        before.gate.release()
        self.holds_slot = False
        self.pool += 1
        self.backend, window = self.pools[self.pool]
        log.info("pool %s refused a request of model %s for length; trying pool %s (max_model_len %d)",
                 before.name, self.model, self.backend.name, window)
        self.services.recorder.count_pool_fallback(self.model, before.name, self.backend.name)
        await self.backend.gate.acquire()
        self.holds_slot = True
        return self.backend.upstream

    def retry_with(self, limit: int) -> None:
        """The upstream counted more than brimful did: resend with the limit its numbers allow."""
        assert self.request is not None
        outcome = self.outcome
        outcome.length_retries += 1
        outcome.granted_max_tokens = limit
        outcome.action = Action.CLAMPED
        self.services.recorder.count_length_retry(self.model)
        self.changes = {**self.changes, **{name: limit for name in self.limit_fields}}
        self.surface.follow_limit(self.request.fields, self.changes)
        self.outgoing = jsonbody.with_fields(self.request.body, self.request.fields, self.changes)
        self.info = _replace_header(self.info, b"x-brimful-granted-max-tokens", limit)
        self.info = _replace_header(self.info, b"x-brimful-action", Action.CLAMPED)

    # -- relay ----------------------------------------------------------------------------

    async def relay(self, response: UpstreamResponse) -> None:
        assert self.backend is not None
        headers = client_headers(forwardable(response.raw_headers, DROP_REQUEST_ID),
                                 self.backend.upstream.base_url) + self.info
        content_type = response.headers.get("content-type") or ""
        if content_type.startswith("text/event-stream"):
            await self.relay_stream(response, headers)
            return
        try:
            parts, whole = await self.read_answer(response)
        except BrimfulError as err:
            await self.answer_error(err, Action.UPSTREAM_ERROR)
            return
        if not whole:
            await self.relay_large(response, headers, parts, scanned=not content_type or "json" in content_type)
            return
        payload = parts[0] if len(parts) == 1 else b"".join(parts)
        data = parse_json_payload(payload)
        if data is None and (not content_type or "json" in content_type):
            # A 200 whose JSON is cut short (`{"id": "x", "choices": [`) is no answer: say so.
            what = "an empty body" if not payload.strip() else "a body that is not complete JSON"
            invalid = errors.upstream_invalid_answer(self.backend.upstream.public_url, response.status,
                                                     len(payload), what)
            await self.answer_error(invalid, Action.UPSTREAM_ERROR)
            return
        self.outcome.status = response.status
        await send_whole(self.send, response.status, payload, headers)
        usage = Usage()
        self.surface.read_usage(data, usage)
        self.take_usage(usage)

    async def read_answer(self, response: UpstreamResponse) -> tuple[list[bytes], bool]:
        """The answer's body: whole (True), or the first chunks past MAX_WHOLE_ANSWER (False)."""
        assert self.backend is not None
        parts: list[bytes] = []
        size = 0
        try:
            while chunk := await response.next_chunk():
                parts.append(chunk)
                size += len(chunk)
                if size > MAX_WHOLE_ANSWER:
                    return parts, False
        except BaseException as exc:
            response.close()
            mapped = self.backend.upstream.map_exception(exc, phase="reading the response body")
            if mapped is exc:
                raise
            raise mapped from exc
        response.release()
        return parts, True

    async def relay_large(self, response: UpstreamResponse, headers: Headers, parts: list[bytes],
                          *, scanned: bool) -> None:
        """A large non-streamed answer, relayed as it arrives (proxy.admitted.answer scans it on the way).

        The latest chunk is held back until the next one comes: an answer whose
        end turns out incomplete (cut short, the upstream gone) is then cut
        before its last bytes, which the client sees as a broken response, never
        as a complete success.  `scanned` False: the answer is not JSON (the pooling
        routes' `encoding_format: "bytes"` is raw octets, as a small one is relayed
        unread), so only a failure of the upstream can cut it.
        """
        assert self.backend is not None
        upstream, outcome, send = self.backend.upstream, self.outcome, self.send
        outcome.status = response.status
        length = response.headers.get("content-length")
        if length is not None:
            headers = [*headers, (b"content-length", length.encode("latin-1"))]
        await send_start(send, response.status, headers)
        scanner = AnswerScanner()
        held = b"".join(parts)
        if scanned:
            scanner.feed(held)
        size = len(held)
        failure: BrimfulError | None = None
        try:
            while chunk := await response.next_chunk():
                if scanned:
                    scanner.feed(chunk)
                size += len(chunk)
                await send_chunk(send, held)
                held = chunk
        except asyncio.CancelledError:
            response.close()
            raise
        except Exception as exc:
            mapped = upstream.map_exception(exc, phase="reading the response body")
            failure = mapped if isinstance(mapped, BrimfulError) else errors.upstream_broken(
                upstream.public_url, f"{type(exc).__name__}: {exc}")
            response.close()
        finally:
            response.release()
        if failure is None and scanned and not scanner.complete:
            failure = errors.upstream_invalid_answer(upstream.public_url, response.status, size,
                                                     "a large body that is not complete JSON")
        if failure is not None:
            # Nothing can be added to a JSON body already under way: leave it unfinished.
            log.warning("model %s: a large answer broke off mid-way (%s); the client's response is cut",
                        self.model, failure.code)
            outcome.fail(Action.UPSTREAM_ERROR, failure.code)
            return
        await send_chunk(send, held, more=False)
        usage = Usage()
        reasons = [{"finish_reason": reason} for reason in scanner.finish_reasons]
        self.surface.read_usage({"usage": scanner.usage(), "choices": reasons}, usage)
        self.take_usage(usage)

    async def relay_stream(self, response: UpstreamResponse, headers: Headers) -> None:
        """Relay SSE bytes as they arrive; a failure after the start becomes an error event.

        With `strip_usage` (brimful asked for the usage chunk the client did
        not), bytes are relayed per complete event so that one event can be
        dropped; nothing waits longer than the end of the event it is in.
        """
        assert self.backend is not None
        upstream, outcome, send = self.backend.upstream, self.outcome, self.send
        outcome.status = response.status
        await send_start(send, response.status, headers)
        scanner = EventStreamScanner(self.surface)
        failure: BrimfulError | None = None
        try:
            try:
                while chunk := await response.next_chunk():
                    if outcome.ttfb_ms is None:
                        outcome.ttfb_ms = (time.perf_counter() - self.started) * 1000
                    if self.strip_usage:
                        chunk = scanner.drop_usage_events(chunk)
                        if not chunk:
                            continue
                    else:
                        scanner.feed(chunk)
                    await send_chunk(send, chunk)
                    outcome.delivered = scanner.done or (scanner.failed and self.surface.error_ends_stream)
            except asyncio.CancelledError as exc:
                response.close()
                if not is_shutdown_deadline(exc):
                    raise
                # SIGTERM's drain deadline passed with this stream still open: end it
                # with an error event instead of a cut that could look complete.
                failure = errors.shutting_down(self.services.config.server.shutdown_timeout)
            except Exception as exc:
                mapped = upstream.map_exception(exc, phase="streaming the response")
                failure = mapped if isinstance(mapped, BrimfulError) else errors.upstream_broken(
                    upstream.public_url, f"{type(exc).__name__}: {exc}"
                )
            finally:
                response.release()
            ended = scanner.done or (scanner.failed and self.surface.error_ends_stream)
            if failure is None and not ended:
                failure = errors.upstream_broken(
                    upstream.public_url, f"the stream ended without its final {self.surface.stream_end_event}"
                )
            tail = scanner.leftover() if self.strip_usage else b""
            if failure is not None:
                outcome.fail(Action.UPSTREAM_ERROR, failure.code)
                tail = (b"\n\n" if not scanner.at_boundary else b"") + self.surface.error_event(
                    failure, scanner.last_data)
            await send_chunk(send, tail, more=False)
        finally:
            self.take_usage(scanner.usage)
            if scanner.failed:
                # vLLM's own error event: the client got it as sent; the record says the
                # request failed upstream (not with the upstream's code, which would make
                # the error_code label set unbounded).
                outcome.fail(Action.UPSTREAM_ERROR, ErrorCode.UPSTREAM_STREAM_ERROR)

    # -- answers and the record ---------------------------------------------------------------

    async def answer_error(self, err: BrimfulError, action: Action) -> None:
        """The error in the surface's shape (a Codex turn's length refusal in the code Codex still
        compacts after: proxy.admitted.codex); the record and x-brimful-action say what happened."""
        if action == Action.UPSTREAM_ERROR and err.status >= 500 and self.backend is not None:
            # The operator's view: which upstream, and the transport's own cause (never the
            # upstream's message, which may quote the prompt).
            log.warning("upstream %s (%s): %s answered %d%s", self.backend.name, self.backend.upstream.base_url,
                        err.code, err.status, f" ({err.details['cause']})" if "cause" in err.details else "")
        self.outcome.status = err.status
        self.outcome.fail(action, err.code)
        self.info = _replace_header(self.info, b"x-brimful-action", action)
        err = codex.refusal(err, self.scope["headers"])
        await send_whole(self.send, err.status, self.surface.error_body(err), err.response_headers(self.info))

    async def answer_shutdown(self) -> None:
        """The drain deadline cut the request: a 503 if nothing was sent yet, else only the record."""
        err = errors.shutting_down(self.services.config.server.shutdown_timeout)
        if self.outcome.status == 0:
            await self.answer_error(err, Action.UPSTREAM_ERROR)
            return
        self.outcome.action = Action.UPSTREAM_ERROR
        self.outcome.error_code = err.code

    def take_usage(self, usage: Usage) -> None:
        """The upstream's usage into the outcome, where it can be true (proxy.sizing.lengths.plausible_usage)."""
        outcome = self.outcome
        n = self.request.n if self.request is not None else 1
        prompt, completion = plausible_usage(usage.prompt_tokens, usage.completion_tokens, self.max_model_len,
                                             n, self.counted.prompts)
        if (prompt, completion) != (usage.prompt_tokens, usage.completion_tokens):
            _warn_implausible(self.model, usage, self.max_model_len)
        if prompt is not None:
            outcome.upstream_prompt_tokens = prompt
        if completion is not None:
            outcome.completion_tokens = completion
        outcome.finish_reasons.extend(usage.finish_reasons)

    def finish(self) -> None:
        record = length_record(
            ts=self.arrived, endpoint=self.surface.name, request_id=self.request_id, request=self.request,
            model=self.model, max_model_len=self.max_model_len, decision=self.decision, counted=self.counted,
            outcome=self.outcome, latency_ms=(time.perf_counter() - self.started) * 1000,
        )
        if (self.counted.trusted_usage and record.model is not None and record.prompt_tokens is not None
                and record.upstream_prompt_tokens is not None):
            if record.prompt_tokens != record.upstream_prompt_tokens:
                log.warning(
                    "prompt-token drift on model %s: brimful counted %d, the upstream reported %d",
                    record.model, record.prompt_tokens, record.upstream_prompt_tokens,
                )
            self.services.counter.answered(record.model, record.prompt_tokens, record.upstream_prompt_tokens,
                                           under=self.counted_under)
        try:
            self.services.recorder.record(record, self.counted.source)
        except Exception:  # recording must never fail a request
            log.exception("could not record a request's length figures")


_IMPLAUSIBLE_WARNED: set[str | None] = set()


def _warn_implausible(model: str | None, usage: Usage, max_model_len: int | None) -> None:
    """Once per model: an upstream whose usage cannot be true is worth one line, not one per request."""
    if model in _IMPLAUSIBLE_WARNED:
        return
    _IMPLAUSIBLE_WARNED.add(model)
    log.warning("model %s: the upstream reported usage prompt_tokens=%s, completion_tokens=%s, which cannot be "
                "true (max_model_len %s); such counts are left out of the records", model,
                str(usage.prompt_tokens)[:24], str(usage.completion_tokens)[:24], max_model_len)


def brimful_headers(prompt: int | None, max_model_len: int | None, d: Decision, request_id: str,
                     count_source: str | None = None) -> Headers:
    """The x-brimful-* headers that tell the client what brimful did, and on which numbers."""
    headers = [(b"x-brimful-action", d.action.encode()), (b"x-request-id", request_id.encode())]
    if prompt is not None:
        headers.append((b"x-brimful-prompt-tokens", str(prompt).encode()))
    if count_source is not None:
        headers.append((b"x-brimful-count", count_source.encode()))
    if d.margin:
        headers.append((b"x-brimful-margin-tokens", str(d.margin).encode()))
    if max_model_len is not None:
        headers.append((b"x-brimful-max-model-len", str(max_model_len).encode()))
    if d.requested is not None:
        headers.append((b"x-brimful-requested-max-tokens", str(d.requested).encode()))
    if d.granted is not None:
        headers.append((b"x-brimful-granted-max-tokens", str(d.granted).encode()))
    return headers


def _replace_header(headers: Headers, name: bytes, value: object) -> Headers:
    return [(k, v) for k, v in headers if k != name] + [(name, str(value).encode())]
