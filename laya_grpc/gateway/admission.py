"""Admission: a bounded wait queue in front of a budget of slots and of rows, shared by HTTP and
gRPC, and the capped, time-limited body read (upstream `laya serve`).

A decision request takes a slot before its body is read (which bounds how many bodies are
buffered at once) and, once parsed, its cost: rows, one per (state, question) pair. Two budgets:

* slots (`LAYA_MAX_CONCURRENT`, default 512, the order of what the engine batches at once):
  requests past auth being answered at once;
* rows (`LAYA_MAX_ROWS_IN_FLIGHT`, default 4096: upstream's largest batch, 64 states x 64
  questions, 16 of the inference service's full forward passes): the rows the larger requests
  hold; more would only queue inside the engine, in front of everyone's next turn. A request
  of at most `LAYA_SMALL_REQUEST_ROWS` rows (default 64) is outside this budget (the slots bound
  it), so heavy batches that hold the row budget never lock out small requests, nor small ones
  starve a heavy one; a request larger than the whole budget runs alone.

A request that finds no slot or no rows waits, up to `LAYA_QUEUE_TIMEOUT_SECONDS` (default 10 s; a
request whose own deadline comes first fails TIMEOUT then) with at most `LAYA_MAX_QUEUE` others
(default 1024). Whenever room
frees, the waiter whose client (transport and peer host) holds the fewest slots goes first, the
oldest among equals: one client's burst cannot starve another, nor one transport the other. Past
the queue the request is BUSY: HTTP 503 + `Retry-After`, gRPC UNAVAILABLE + RetryInfo
(`core/errors.py`). `LAYA_MAX_QUEUE=0` refuses at once when full, as upstream does.

Retry storms are the queue's business too, because a client that ignores the retry hint would
otherwise take the places that the clients waiting out their delay come back to:

* a refusal starts the retry delay (`RETRY_DELAY_S`, the hint's 1 s) of the request's connection
  (an HTTP connection; a gRPC peer address and port, which all calls and streams of one channel
  share). A request on that connection before the delay has passed gets no queue place: it is
  refused at once and the delay starts again. Only a request that needs no wait goes in;
* a request that comes back after its delay takes its place in the queue by the time of the
  refusal, not behind everyone who arrived while it waited; when the queue is full, the newest
  place (if newer than its turn) is refused instead;
* a full queue takes a place from the heaviest client (slots held plus places queued), its
  newest place, for a request from a client at least two lighter, instead of refusing it.

Clients behind one address share the delay only per connection, so a refusal never reaches
another client's requests; `client.py` holds all calls of one channel back for the delay. Behind
a proxy that carries many clients on one connection that no longer holds: `LAYA_PROXIED_CLIENTS`
turns the connection delays off (fairness and the heaviest client's eviction stay).

Because the slot is held while the body arrives, the read has a deadline
(`LAYA_BODY_READ_TIMEOUT`): a stalled upload gets 408 and frees its slot.
"""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import memory, metrics
from laya_grpc.core.errors import BUSY_DETAIL, RETRY_DELAY_S, Kind, LayaError

from laya_grpc.engine import deadline

MAX_BODY_BYTES = 2 * 1024 * 1024
# request bytes after which an idle gateway gives freed heap back (core/runtime/memory.py): a 2 MiB body is
# parsed into many objects and copied into the tokenizer's request, and glibc keeps what they free
TRIM_AFTER_BYTES = 1024 * 1024
_timeout = getattr(asyncio, "timeout", None)   # Python 3.11+; 3.10 (still supported) uses wait_for

TOO_LARGE_DETAIL = "request body too large"
TIMEOUT_DETAIL = "request body was not received in time"
DEADLINE_DETAIL = "the request's deadline passed while it waited for admission"


@dataclass(frozen=True)
class Limits:
    max_concurrent: int = 512         # slots: requests answered at once
    max_queue: int = 1024             # requests waiting for a slot or rows; 0: refuse at once when full
    queue_timeout_s: float = 10.0     # longest wait before BUSY
    max_rows: int = 4096              # rows (state x question pairs) the larger requests answered hold
    small_rows: int = 64              # at most this many rows: never waits for rows
    connection_delays: bool = True    # a refusal's retry delay binds its connection (off behind a proxy)


def rows_of(states: int, questions: int) -> int:
    """A request's cost: one row per (state, question) pair, at least 1."""
    return max(1, states) * max(1, questions)


class _Waiter:
    __slots__ = ("ticket", "rows", "seq", "future", "queued")

    def __init__(self, ticket: "Ticket", rows: int, seq: int):
        self.ticket, self.rows, self.seq, self.queued = ticket, rows, seq, False
        self.future = asyncio.get_running_loop().create_future()


class Ticket:
    """One request's hold on admission: `async with admission.enter(client, conn) as ticket:` takes
    a slot (waiting in the queue if need be); `await ticket.charge(rows)` takes its rows; leaving
    the block gives both back. `client` is whom fairness counts (transport and peer host), `conn`
    whom a retry delay binds (the connection; `client` when not given)."""
    __slots__ = ("admission", "client", "conn", "slot", "rows")

    def __init__(self, admission: "Admission", client: str, conn: str):
        self.admission, self.client, self.conn, self.slot, self.rows = admission, client, conn or client, False, 0

    async def __aenter__(self) -> "Ticket":
        a = self.admission
        if not a._queued[0] and a.taken < a.limits.max_concurrent:
            a._grant_slot(self)
        else:
            try:
                await a._wait(self, 0)
            except BaseException:
                a._leave(self)   # granted in the same instant it was given up: hand it back
                raise
        return self

    async def __aexit__(self, *exc) -> None:
        self.admission._leave(self)

    def charge_now(self, rows: int) -> bool:
        """Take the rows if that needs no wait: small requests never wait, large ones take their
        turn behind the large ones already waiting. False: nothing taken, `charge` waits."""
        a = self.admission
        if rows <= a.limits.small_rows or (a._rows_fit(rows) and not a._queued[1]):
            a._grant_rows(self, rows)
            return True
        return False

    async def charge(self, rows: int) -> None:
        if not self.charge_now(rows):
            await self.admission._wait(self, rows)


# a re-send this much before its delay ends still counts as waiting it out (the client's timer
# starts when the refusal reaches it, so it is late by a round trip, never early by more than this)
RETRY_SLACK_S = 0.05
# connections whose refusal is remembered, at most: past it the oldest are forgotten (a
# forgotten connection only loses its delay and its turn)
MAX_REMEMBERED = 65536


class Admission:
    """The slots and rows of one gateway process, over HTTP and gRPC together (module docstring).

    Everything runs on the event loop's thread, so plain counters are the whole state. The slot
    count also says when the gateway is idle: `trim` gives freed heap back once no slot has been
    taken for a moment after large requests (their bytes are `trim.add`ed by the fronts)."""

    def __init__(self, limits: Limits = Limits(), retry_delay_s: float = RETRY_DELAY_S,
                 clock=time.monotonic):
        self.limits, self.retry_delay_s, self.clock = limits, retry_delay_s, clock
        self.taken = 0                      # slots held
        self.rows = 0                       # rows held
        self.per_client: dict[str, int] = {}
        self.queued_per_client: dict[str, int] = {}
        self._waiting: list[_Waiter] = []
        self._queued = [0, 0]               # waiters for a slot, for rows
        self._seq = itertools.count()
        self._refused: dict[str, tuple[float, int]] = {}   # conn -> (end of its retry delay, its turn)
        self.trim = memory.IdleTrim(lambda: self.taken, lambda fn: asyncio.get_running_loop().run_in_executor(None, fn),
                                    TRIM_AFTER_BYTES, metrics.GATEWAY_HEAP_TRIMS)

    def enter(self, client: str = "", conn: str = "") -> Ticket:
        return Ticket(self, client, conn)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _rows_fit(self, rows: int) -> bool:
        return rows <= self.limits.small_rows or self.rows == 0 or self.rows + rows <= self.limits.max_rows

    def _grant_slot(self, t: Ticket) -> None:
        t.slot = True
        self.taken += 1
        self.per_client[t.client] = self.per_client.get(t.client, 0) + 1

    def _grant_rows(self, t: Ticket, rows: int) -> None:
        if rows > self.limits.small_rows:   # small requests are outside the budget: bounded by the slots
            t.rows = rows
            self.rows += rows

    def _eligible(self, w: _Waiter) -> bool:
        if w.future.done():
            return False
        if w.rows:
            return self._rows_fit(w.rows)
        return self.taken < self.limits.max_concurrent

    def _enqueue(self, w: _Waiter) -> None:
        w.queued = True
        self._waiting.append(w)
        self._queued[bool(w.rows)] += 1
        c = w.ticket.client
        self.queued_per_client[c] = self.queued_per_client.get(c, 0) + 1

    def _dequeue(self, w: _Waiter) -> None:
        if not w.queued:
            return
        w.queued = False
        self._waiting.remove(w)
        self._queued[bool(w.rows)] -= 1
        c = w.ticket.client
        left = self.queued_per_client.get(c, 1) - 1
        if left:
            self.queued_per_client[c] = left
        else:
            self.queued_per_client.pop(c, None)

    def _load(self, client: str) -> int:
        return self.per_client.get(client, 0) + self.queued_per_client.get(client, 0)

    def _wake(self) -> None:
        """Grant room to waiters while some fits: the fewest slots held by its client first."""
        while self._waiting:
            best, best_key = None, None
            for w in self._waiting:
                if self._eligible(w):
                    key = (self.per_client.get(w.ticket.client, 0), w.seq)
                    if best is None or key < best_key:
                        best, best_key = w, key
            if best is None:
                return
            self._dequeue(best)
            if best.rows:
                self._grant_rows(best.ticket, best.rows)
            else:
                self._grant_slot(best.ticket)
            best.future.set_result(None)

    def _leave(self, t: Ticket) -> None:
        if t.slot:
            t.slot = False
            self.taken -= 1
            held = self.per_client.get(t.client, 1) - 1
            if held:
                self.per_client[t.client] = held
            else:
                self.per_client.pop(t.client, None)
            self.trim.ended()
        if t.rows:
            self.rows -= t.rows
            t.rows = 0
        self._wake()

    # -- refusals and retry delays ---------------------------------------------------------------
    def _refusal(self, t: Ticket, seq: int, reason: str = "busy") -> LayaError:
        """BUSY for `t`, whose connection's retry delay (re)starts now; `seq`, its turn, is kept for
        when it comes back after the delay."""
        metrics.REJECTED.labels(t.client.partition(":")[0] or "gateway", reason).inc()
        if not self.limits.connection_delays:
            return LayaError(Kind.BUSY, BUSY_DETAIL)
        now = self.clock()
        self._refused.pop(t.conn, None)   # re-inserted last: the dict stays in order of refusal
        self._refused[t.conn] = (now + self.retry_delay_s, seq)
        if len(self._refused) > MAX_REMEMBERED:
            for conn in list(itertools.islice(self._refused, len(self._refused) - MAX_REMEMBERED // 2)):
                del self._refused[conn]
        return LayaError(Kind.BUSY, BUSY_DETAIL)

    def _turn(self, t: Ticket) -> int:
        """The queue turn of a request that must wait: its connection's earlier turn when it comes
        back after its retry delay, a new one otherwise; BUSY (the delay restarts) when it comes
        back before the delay has passed."""
        back = self._refused.get(t.conn)
        if back is None:
            return next(self._seq)
        until, seq = back
        if self.clock() < until - RETRY_SLACK_S:
            raise self._refusal(t, seq, "early_retry")
        del self._refused[t.conn]
        return seq

    def _make_room(self, client: str, seq: int) -> bool:
        """The queue is full: a place goes (BUSY) if the request is owed one. The newest place of
        the heaviest client goes for a request from a client at least two lighter, so a burst from
        one client cannot refuse everyone else; else the newest place of all goes for a request back
        after its retry delay whose turn (`seq`) is older, so places taken while it waited are not
        kept from it."""
        victim = None
        if self.queued_per_client:
            heaviest = max(self.queued_per_client, key=self._load)
            if self._load(heaviest) > self._load(client) + 1:
                victim = max((w for w in self._waiting if w.ticket.client == heaviest), key=lambda w: w.seq)
        if victim is None and self._waiting:
            newest = max(self._waiting, key=lambda w: w.seq)
            if newest.seq > seq:
                victim = newest
        if victim is None:
            return False
        self._dequeue(victim)
        victim.future.set_exception(self._refusal(victim.ticket, victim.seq, "evicted"))
        return True

    async def _wait(self, t: Ticket, rows: int) -> None:
        """Queue for a slot (rows == 0) or for `rows`; BUSY when the queue is full or the wait
        runs past the queue time, TIMEOUT (gRPC DEADLINE_EXCEEDED) when it runs past the request's
        own deadline first."""
        seq = self._turn(t)
        if len(self._waiting) >= self.limits.max_queue and not self._make_room(t.client, seq):
            raise self._refusal(t, seq)
        w = _Waiter(t, rows, seq)
        self._enqueue(w)
        wait_s = self.limits.queue_timeout_s
        left = deadline.left()
        by_deadline = left is not None and left < wait_s
        if by_deadline:
            wait_s = left
        t0 = time.perf_counter()
        try:
            await asyncio.wait_for(asyncio.shield(w.future), wait_s)
        except asyncio.TimeoutError:
            if w.future.done() and not w.future.cancelled():   # decided just as the wait ran out
                if w.future.exception() is None:
                    return
                raise w.future.exception() from None
            if by_deadline:   # the request's own time ran out, not the queue's: no refusal, no retry delay
                raise LayaError(Kind.TIMEOUT, DEADLINE_DETAIL) from None
            raise self._refusal(t, seq) from None
        finally:
            self._dequeue(w)
            if not w.future.done():
                w.future.cancel()
            elif not w.future.cancelled():
                w.future.exception()   # an eviction nobody awaited any more: seen
            metrics.ADMISSION_WAIT_SECONDS.observe(time.perf_counter() - t0)


async def read_body(receive_stream, content_length: Optional[str], timeout: float) -> bytes:
    """The whole body, refusing more than 2 MiB (declared or streamed) and stalls past `timeout`.

    `receive_stream` is Starlette's `request.stream()`. A `Content-Length` over the cap is refused
    before any byte is read; a malformed one is ignored here (uvicorn refuses it first).
    """
    if content_length:
        try:
            declared = int(content_length)
        except ValueError:
            declared = 0
        if declared > MAX_BODY_BYTES:
            raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)

    async def collect() -> bytes:
        total = 0
        chunks = []
        async for chunk in receive_stream:
            if not chunk:
                continue
            total += len(chunk)
            if total > MAX_BODY_BYTES:
                raise LayaError(Kind.TOO_LARGE, TOO_LARGE_DETAIL)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        if _timeout is not None:
            async with _timeout(timeout):   # in this task: wait_for starts another one (before 3.12)
                return await collect()
        return await asyncio.wait_for(collect(), timeout=timeout)
    except asyncio.TimeoutError:            # TimeoutError itself from 3.11 on
        raise LayaError(Kind.TIMEOUT, TIMEOUT_DETAIL) from None
