"""Pacing requests by the rate-limit budgets the provider announces.

OpenAI limits each model by requests and tokens per minute and says where a caller stands on
every answer: `x-ratelimit-limit-{requests,tokens}`, `x-ratelimit-remaining-{requests,tokens}`
and `x-ratelimit-reset-{requests,tokens}`. A budget refills continuously (a minute's worth per
minute), so the client can keep its own copy of it and spend it:

- before a request is sent its tokens are estimated (prompt characters / 4, the rule of thumb
  for OpenAI tokenizers, plus the output the caller expects) and taken from the copy; when
  the copy does not hold them the request waits exactly as long as the refill takes, instead
  of being sent to collide with a 429;
- every answer re-bases the copy on what the provider said at that request's admission,
  minus whatever may have been charged since: every request not answered before that one
  went out counts as charged after it, since the order requests are sent in says nothing
  about the order the provider admits them in;
- concurrency is whatever the budgets allow, up to a high ceiling, not a fixed window;
- a 429 that slips through (an estimate too low, another client on the same key) pauses
  sending until the provider's `retry-after-ms` and widens a reserve kept out of the budget,
  so the next estimates are safer; throughput is not cut.

A server that sends no such headers (many OpenAI-compatible servers) keeps today's behaviour:
the `AdaptiveLimiter` window, which shrinks on a 429 and grows back.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

CHARS_PER_TOKEN = 4
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_KINDS = ("requests", "tokens")
# The ticket of the request the current task is sending: the HTTP client's request hook stamps
# the moment its bytes go out, which can be long after the ticket was issued on a busy loop.
CURRENT_TICKET: contextvars.ContextVar["Ticket | None"] = contextvars.ContextVar("tkg_rate_limit_ticket", default=None)


def estimate_tokens(*texts: str) -> int:
    """Tokens of prompt text without a tokenizer: characters / 4, rounded up."""
    return math.ceil(sum(len(text) for text in texts) / CHARS_PER_TOKEN)


def parse_duration(text: str | None) -> float | None:
    """Seconds in an OpenAI reset header ("20ms", "1.5s", "6m0s", "1h2m") or a plain number; None
    when it is none of those."""
    if text is None:
        return None
    text = text.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(number) * scale[unit] for number, unit in parts)


@dataclass(frozen=True)
class Announced:
    """One budget as a response announced it."""

    limit: int
    remaining: int
    reset_s: float


def read_limits(headers: Mapping[str, str] | None) -> dict[str, Announced]:
    """The budgets a response announces, by kind ("requests", "tokens"); a kind whose three
    headers are not all present and well formed is left out (a malformed header is not trusted)."""
    found: dict[str, Announced] = {}
    if not headers:
        return found
    for kind in _KINDS:
        limit, remaining = headers.get(f"x-ratelimit-limit-{kind}"), headers.get(f"x-ratelimit-remaining-{kind}")
        reset = parse_duration(headers.get(f"x-ratelimit-reset-{kind}"))
        try:
            limit_value, remaining_value = int(limit), int(remaining)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if limit_value > 0 and 0 <= remaining_value <= limit_value and reset is not None:
            found[kind] = Announced(limit_value, remaining_value, reset)
    return found


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """The wait a 429 asks for: `retry-after-ms`, else `retry-after` (seconds)."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = (headers or {}).get(name)
        if value:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


class AdaptiveLimiter:
    """At most `limit` requests in flight (AIMD): the fallback for servers that announce no
    budgets. A 429 cuts the limit by a quarter (at most twice a second, so one burst counts
    once); every `limit / 4` successes in a row add a slot back, up to `maximum`."""

    def __init__(self, maximum: int) -> None:
        self.maximum = max(1, maximum)
        self.limit = self.maximum
        self.in_flight = 0
        self._condition = asyncio.Condition()
        self._successes = 0
        self._last_cut = 0.0

    async def acquire(self) -> None:
        async with self._condition:
            await self._condition.wait_for(lambda: self.in_flight < self.limit)
            self.in_flight += 1

    async def give_back(self) -> None:
        """Return a slot that was acquired but not used (no answer to learn from)."""
        async with self._condition:
            self.in_flight -= 1
            self._condition.notify_all()

    async def release(self, rate_limited: bool = False) -> None:
        async with self._condition:
            self.in_flight -= 1
            now = time.monotonic()
            if rate_limited:
                self._successes = 0
                if now - self._last_cut > 0.5:
                    self.limit = max(1, (self.limit * 3) // 4)
                    self._last_cut = now
            else:
                self._successes += 1
                if self._successes >= max(1, self.limit // 4) and self.limit < self.maximum:
                    self.limit += 1
                    self._successes = 0
            self._condition.notify_all()


@dataclass
class Ticket:
    """One request the pacer let through: what it was charged, and how it was admitted."""

    model: str
    sequence: int
    issued_at: float
    input_tokens: int
    output_tokens: int  # expected until the answer says; then the actual count
    paced: bool  # False: it went through the fallback window
    charged: bool = False  # taken from the copy of the budgets (its output is corrected when known)
    sent_at: float | None = None  # when the request went out (the HTTP hook); None: not yet
    done_at: float | None = None

    def went_out(self) -> float:
        return self.sent_at if self.sent_at is not None else self.issued_at


async def stamp_sent_request(request: object) -> None:
    """httpx request hook: the current ticket's request is going out now."""
    ticket = CURRENT_TICKET.get()
    if ticket is not None:
        ticket.sent_at = time.monotonic()


@dataclass
class _Budget:
    limit: int
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(float(self.limit), self.level + (now - self.at) * self.limit / 60.0)
        self.at = now

    def seconds_until(self, amount: float) -> float:
        return max(0.0, amount - self.level) * 60.0 / self.limit


@dataclass
class _ModelState:
    """What the client knows of one model's budgets."""

    budgets: dict[str, _Budget] = field(default_factory=dict)
    announces: bool | None = None  # None: no answer yet; False: answers carry no budgets
    reserve: float = 0.02  # share of the tokens budget kept back; widened by each 429
    blocked_until: float = 0.0
    tickets: dict[int, Ticket] = field(default_factory=dict)  # that a later answer's re-base may still count
    rate_limited: int = 0


class RateLimitPacer:
    """Lets requests through as the announced budgets allow (see the module docstring); one per
    client, shared by every stage and thread that uses it."""

    def __init__(self, fallback_max_in_flight: int, ceiling: int = 512) -> None:
        self.fallback = AdaptiveLimiter(fallback_max_in_flight)
        self.ceiling = max(1, ceiling)
        self.in_flight = 0
        self._models: dict[str, _ModelState] = {}
        self._sequence = 0
        self._condition = asyncio.Condition()

    def announces(self, model: str) -> bool | None:
        """Whether `model`'s answers announce budgets (None: not known yet)."""
        state = self._models.get(model)
        return state.announces if state else None

    def budgets(self, model: str) -> dict[str, tuple[int, float]]:
        """(limit, level) of each budget the client holds for `model` (for logs and tests)."""
        state = self._models.get(model)
        return {kind: (budget.limit, budget.level) for kind, budget in (state.budgets.items() if state else ())}

    async def acquire(self, model: str, input_tokens: int, output_tokens: int) -> Ticket:
        """Wait until `model`'s budgets hold one more request of this size, and charge it."""
        state = self._models.setdefault(model, _ModelState())
        if state.announces is not True:  # not known yet, or a server without budgets: the window
            await self.fallback.acquire()
            if state.announces is not True:
                async with self._condition:
                    return self._issue(state, model, input_tokens, output_tokens, paced=False)
            # The budgets became known while this request queued for the window: pace it instead.
            await self.fallback.give_back()
        async with self._condition:
            while True:
                now = time.monotonic()
                wait = state.blocked_until - now
                if wait <= 0:
                    wait = self._shortfall(state, now, input_tokens + output_tokens)
                if wait <= 0 and self.in_flight < self.ceiling:
                    for kind, budget in state.budgets.items():
                        budget.level -= 1 if kind == "requests" else input_tokens + output_tokens
                    ticket = self._issue(state, model, input_tokens, output_tokens, paced=True)
                    ticket.charged = True
                    return ticket
                try:  # an answer may re-base the budgets sooner; otherwise wake when the refill is due
                    await asyncio.wait_for(self._condition.wait(), timeout=max(0.005, wait) if wait > 0 else None)
                except asyncio.TimeoutError:
                    pass

    def _shortfall(self, state: _ModelState, now: float, tokens: int) -> float:
        """Seconds until both budgets hold one request of `tokens` (0: they do now)."""
        wait = 0.0
        for kind, budget in state.budgets.items():
            budget.refill(now)
            # The reserve covers what the copy cannot see: the time between taking a ticket and
            # the provider's admission, and estimates that run short. A request bigger than the
            # whole budget goes once the budget is full.
            need = (1 if kind == "requests" else tokens) + state.reserve * budget.limit
            wait = max(wait, budget.seconds_until(min(need, budget.limit)))
        return wait

    def _issue(self, state: _ModelState, model: str, input_tokens: int, output_tokens: int, paced: bool) -> Ticket:
        self._sequence += 1
        self.in_flight += 1
        ticket = Ticket(model, self._sequence, time.monotonic(), input_tokens, output_tokens, paced)
        CURRENT_TICKET.set(ticket)  # in the acquiring task's context: its HTTP hook stamps it
        state.tickets[ticket.sequence] = ticket
        return ticket

    async def release(self, ticket: Ticket, headers: Mapping[str, str] | None, *, output_tokens: int | None = None,
                      rate_limited: bool = False, answered: bool = True) -> None:
        """Account for `ticket`'s answer: its headers re-base the budgets, a 429 pauses the model
        until its retry-after and widens the reserve. `answered` is False when no HTTP answer
        came (a timeout or a dropped connection)."""
        if CURRENT_TICKET.get() is ticket:  # later requests of this task are not this ticket's
            CURRENT_TICKET.set(None)
        if not ticket.paced:
            await self.fallback.release(rate_limited=rate_limited)
        async with self._condition:
            self.in_flight -= 1
            state = self._models[ticket.model]
            now = time.monotonic()
            ticket.done_at = now
            if ticket.sent_at is None:  # never reached the wire (or no hook): dated by its issue
                ticket.sent_at = ticket.issued_at
            if output_tokens is not None:
                tokens = state.budgets.get("tokens")
                if ticket.charged and tokens is not None:  # the copy took the expected output
                    tokens.level += ticket.output_tokens - output_tokens
                ticket.output_tokens = output_tokens
            elif rate_limited or not answered:
                ticket.output_tokens = 0  # nothing was generated
            announced = read_limits(headers)
            if answered and headers is not None:
                if announced:
                    if state.announces is not True:
                        log.info("model %s: the provider announces its rate limits (%s); pacing by them",
                                 ticket.model, ", ".join(f"{k} {v.limit}/min" for k, v in announced.items()))
                    state.announces = True
                elif state.announces is None and not rate_limited:
                    state.announces = False
                    log.info("model %s: no rate-limit headers from the server; keeping the adaptive window", ticket.model)
            if announced:
                self._rebase(state, ticket, announced, now)
            if rate_limited:
                state.rate_limited += 1
                tokens = state.budgets.get("tokens")
                if tokens is not None:
                    state.reserve = min(0.25, state.reserve * 1.5 + 0.01)
                pause = retry_after_s(headers)
                if pause is not None:
                    state.blocked_until = max(state.blocked_until, now + pause)
                    # A remaining of 0 hides how far below zero the budget is (output charged after
                    # admission). The wait the provider asks for says it: after `pause` the budget
                    # holds exactly this request, so now it holds that much less.
                    for kind, value in announced.items():
                        cost = 1 if kind == "requests" else ticket.input_tokens
                        budget = state.budgets.get(kind)
                        if budget is not None and value.remaining < cost:
                            budget.level = min(budget.level, cost - pause * budget.limit / 60.0)
                            budget.at = now
            self._forget(state, now)
            self._condition.notify_all()

    @staticmethod
    def _rebase(state: _ModelState, ticket: Ticket, announced: dict[str, Announced], now: float) -> None:
        """Bring the copy of the budgets within what `ticket`'s answer proves. The provider said
        `remaining` at the request's admission; what it has charged since is not known exactly:

        - at most: this request's output, and every other request that was not answered before
          this one went out, whole; with no refill credited (the admission may have been just
          now). That is the lowest the budget can be: a copy below it is raised to it.
        - at least: this request's output and the requests not sent yet, with the refill since
          this one went out. That is the highest it can be: a copy above it is lowered to it.

        In between, the copy's own accounting (each request charged when sent, its output
        corrected when its answer says) is kept. Only an answer received before `ticket` went
        out proves that a request was admitted ahead of it: on a busy machine a request sent
        earlier can reach the provider seconds after one sent later (a new connection against a
        kept-alive one, a provider working through a queue), and re-basing on the belief that it
        was already charged is how a burst spent the same tokens twice. A budget seen for the
        first time starts at the lowest reading."""
        base = ticket.went_out()
        since_requests, since_tokens, unsent_requests, unsent_tokens = 0, 0.0, 0, 0.0
        for other in state.tickets.values():
            if other is ticket or (other.done_at is not None and other.done_at < base):
                continue
            since_requests += 1
            since_tokens += other.input_tokens + other.output_tokens
            if other.sent_at is None and other.done_at is None:
                unsent_requests += 1
                unsent_tokens += other.input_tokens + other.output_tokens
        for kind, value in announced.items():
            own = 0 if kind == "requests" else ticket.output_tokens  # charged after its admission
            lowest = value.remaining - own - (since_requests if kind == "requests" else since_tokens)
            highest = (value.remaining + (now - base) * value.limit / 60.0 - own
                       - (unsent_requests if kind == "requests" else unsent_tokens))
            budget = state.budgets.get(kind)
            if budget is None or budget.limit != value.limit:
                state.budgets[kind] = _Budget(value.limit, min(float(value.limit), lowest), now)
                for other in state.tickets.values():
                    other.charged = other.charged or other.done_at is None  # the lowest reading took them
                continue
            budget.refill(now)
            budget.level = min(max(budget.level, lowest), highest, float(value.limit))

    @staticmethod
    def _forget(state: _ModelState, now: float) -> None:
        """Drop tickets no future re-base can count: answered before every request still in
        flight (and any issued from now on) went out."""
        horizon = min([now, *(t.went_out() for t in state.tickets.values() if t.done_at is None)])
        stale = [s for s, t in state.tickets.items() if t.done_at is not None and t.done_at < horizon]
        for sequence in stale:
            del state.tickets[sequence]
