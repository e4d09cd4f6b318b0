"""Python clients for the gateway's gRPC API: blocking (`LayaClient`) and asyncio (`AsyncLayaClient`).

Both take plain Python values (`state` any JSON value, `questions` the /v1/systemone dict),
send them as typed requests (`requests.build_decide`), and return by default the exact
/v1/systemone response dict rebuilt from the typed answer (`answers.response_dict`), so code
written against the HTTP API ports as is. `typed=True` returns the DecideResponse /
DecideBatchResponse messages instead. A failed call raises `laya_grpc.core.errors.LayaError` with
the HTTP-equivalent kind and detail (and `field`, the request field at fault when known).

A busy gateway (UNAVAILABLE, kind BUSY) is retried after the RetryInfo delay it gives, one that
cannot be reached with jittered exponential backoff, until the client's `timeout` is spent; only
then does the call fail, BUSY, saying what the last attempt met. The gateway counts a retry delay
per connection and refuses a call sent on it before the delay has passed (restarting the delay),
so a refusal holds back every call of the client (one channel is one connection), not only the
refused one.
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import grpc
from grpc_status import rpc_status

from laya_grpc.core.wire import rpc
from laya_grpc.core.wire.calls import stream_mux
from laya_grpc.core.errors import BUSY_DETAIL, KIND_METADATA_KEY, Kind, LayaError
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2

from .answers import batch_dict, response_dict
from .requests import build_batch, build_decide


INITIAL_BACKOFF_S = 0.05
MAX_BACKOFF_S = 2.0
# Each client its own connection (gRPC otherwise shares one between channels of a process with the
# same target and options): the gateway's retry delay binds a connection, and each client holds
# back its own calls for it, so two clients on one connection would keep restarting each other's.
CLIENT_CHANNEL_OPTIONS = rpc.CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)]


def _metadata(api_key: Optional[str]):
    return (("authorization", "Bearer " + api_key),) if api_key else None


def _retry_info_s(e: grpc.RpcError) -> Optional[float]:
    """The RetryInfo delay of a failed call, in seconds (None when it has none)."""
    try:
        st = rpc_status.from_call(e)
    except ValueError:
        return None
    return rpc.retry_delay_of(st) if st is not None else None


def _classify(e: grpc.RpcError, address: str) -> tuple[LayaError, bool, Optional[float]]:
    """(the error, whether a retry can succeed, the gateway's RetryInfo delay)."""
    tagged = any(k == KIND_METADATA_KEY for k, _ in (e.trailing_metadata() or ()))
    if e.code() == grpc.StatusCode.UNAVAILABLE and not tagged:   # nothing answered: the transport's own failure
        return LayaError(Kind.BUSY, "no gateway answered at %s (%s)" % (address, e.details())), True, None
    err = rpc.error_from_rpc(e, "gateway")
    return err, err.kind is Kind.BUSY, _retry_info_s(e)


class _Backoff:
    """Waits inside one deadline: `pause(hint)` is how long to sleep before the next attempt (the
    gateway's RetryInfo `hint` and a little jitter; without a hint, jittered exponential backoff),
    or None when no time is left."""

    def __init__(self, timeout: float):
        self.end = time.monotonic() + timeout
        self.attempt = 0

    def left(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def pause(self, hint: Optional[float]) -> Optional[float]:
        if hint:
            delay = hint * random.uniform(1.0, 1.1)   # waiting longer only loses the place it keeps
        else:
            ceiling = min(MAX_BACKOFF_S, INITIAL_BACKOFF_S * (2 ** self.attempt))
            self.attempt += 1
            delay = random.uniform(ceiling / 2, ceiling)
        return delay if time.monotonic() + delay < self.end else None


class _Hold:
    """The end of the retry delay the gateway last asked for, shared by every call of one client."""

    def __init__(self):
        self.until = 0.0

    def left(self) -> float:
        return self.until - time.monotonic()

    def hold(self, seconds: float) -> None:
        self.until = max(self.until, time.monotonic() + seconds)


def _held(hold: _Hold, backoff: _Backoff, err: Optional[LayaError]) -> float:
    """How long to wait before the next attempt for the client's retry delay; raises when the
    delay outlasts the call's timeout (the last error, or BUSY before any attempt)."""
    wait = hold.left()
    if wait > 0 and time.monotonic() + wait >= backoff.end:
        raise err or LayaError(Kind.BUSY, BUSY_DETAIL)
    return max(0.0, wait)


def _call_with_retries(call: Callable[[float], Any], timeout: float, address: str, hold: _Hold) -> Any:
    backoff, err = _Backoff(timeout), None
    while True:
        wait = _held(hold, backoff, err)
        if wait:
            time.sleep(wait)
        try:
            return call(backoff.left())
        except grpc.RpcError as e:
            err, retryable, hint = _classify(e, address)
        pause = _after_failure(backoff, hold, err, retryable, hint)
        if pause:
            time.sleep(pause)


def _after_failure(backoff: "_Backoff", hold: "_Hold", err: Exception, retryable: bool, hint) -> float:
    """The pause before the next try, or raises `err` when it is final. A server's retry hint holds
    every call of this client (the pause then happens in `_held` before the next try: 0 here)."""
    pause = backoff.pause(hint) if retryable else None
    if pause is None:
        raise err
    if hint:
        hold.hold(pause)
        return 0.0
    return pause


async def _acall_with_retries(call: Callable[[float], Any], timeout: float, address: str, hold: _Hold) -> Any:
    backoff, err = _Backoff(timeout), None
    while True:
        wait = _held(hold, backoff, err)
        if wait:
            await asyncio.sleep(wait)
        hint = None
        try:
            return await call(backoff.left())
        except grpc.aio.AioRpcError as e:
            err, retryable, hint = _classify(e, address)
        except LayaError as e:       # a DecideStream call: its reply or the stream's failure
            err, retryable, hint = e, e.kind is Kind.BUSY, e.retry_after_s
            if e.detail == rpc.transport_detail("gateway"):
                err = LayaError(Kind.BUSY, "no gateway answered at %s" % address)
        pause = _after_failure(backoff, hold, err, retryable, hint)
        if pause:
            await asyncio.sleep(pause)


class LayaClient:
    """Blocking client. `with LayaClient("127.0.0.1:50051") as c: c.decide(state, questions)`.

    `typed=True`: `decide` / `decide_batch` return the typed response messages, not dicts."""

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None, timeout: float = 60.0,
                 typed: bool = False):
        self._channel = grpc.insecure_channel(rpc.target(address), options=CLIENT_CHANNEL_OPTIONS)
        self._decisions = decision_pb2_grpc.DecisionServiceStub(self._channel)
        self._status = decision_pb2_grpc.StatusServiceStub(self._channel)
        self._md, self.timeout, self.typed, self.address = _metadata(api_key), timeout, typed, address
        self._hold = _Hold()

    def __enter__(self) -> "LayaClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def decide(self, state: Any, questions: dict, **controls) -> Any:
        """One state; controls: model, task, lang, lang_guess, max_len, head_max_len, min_confidence."""
        req = build_decide(state, questions, **controls)
        resp = _call_with_retries(lambda t: self._decisions.Decide(req, timeout=t, metadata=self._md),
                                  self.timeout, self.address, self._hold)
        return resp if self.typed else response_dict(resp)

    def decide_batch(self, states: list, questions: dict, **controls) -> Any:
        req = build_batch(states, questions, **controls)
        resp = _call_with_retries(lambda t: self._decisions.DecideBatch(req, timeout=t, metadata=self._md),
                                  self.timeout, self.address, self._hold)
        return resp if self.typed else batch_dict(resp)

    def status(self) -> decision_pb2.StatusEvent:
        return self._status.GetStatus(status_pb2.StatusRequest(), timeout=self.timeout)

    def watch(self, heartbeat_s: float = 2.0) -> Iterator[decision_pb2.StatusEvent]:
        """Status events: the current one at once, then on every change and each heartbeat."""
        return self._status.Watch(status_pb2.StatusRequest(heartbeat_s=heartbeat_s))

    def wait_ready(self, timeout: float = 120.0) -> None:
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        stub = health_pb2_grpc.HealthStub(self._channel)
        for r in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=timeout):
            if r.status == health_pb2.HealthCheckResponse.SERVING:
                return


class AsyncLayaClient:
    """asyncio client with the same methods as `LayaClient`, awaitable.

    `decide` calls ride one `DecideStream` per client (`stream=True`, the default): no unary call
    setup per decision on either side, same answers and errors as `Decide` (docs/protocol.md).
    `stream=False` makes one unary `Decide` call each."""

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None, timeout: float = 60.0,
                 stream: bool = True, typed: bool = False):
        self._channel = grpc.aio.insecure_channel(rpc.target(address), options=CLIENT_CHANNEL_OPTIONS)
        self._decisions = decision_pb2_grpc.DecisionServiceStub(self._channel)
        self._status = decision_pb2_grpc.StatusServiceStub(self._channel)
        self._md, self.timeout, self.typed, self.address = _metadata(api_key), timeout, typed, address
        self._hold = _Hold()
        self._mux = stream_mux(lambda: self._decisions.DecideStream(metadata=self._md), decision_pb2.DecideCall,
                               "gateway") if stream else None

    async def __aenter__(self) -> "AsyncLayaClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._mux is not None:
            await self._mux.close()
        await self._channel.close()

    async def decide(self, state: Any, questions: dict, **controls) -> Any:
        req = build_decide(state, questions, **controls)
        if self._mux is not None:
            mux = self._mux
            resp = await _acall_with_retries(lambda t: mux.call(req, t), self.timeout, self.address, self._hold)
        else:
            resp = await _acall_with_retries(lambda t: self._decisions.Decide(req, timeout=t, metadata=self._md),
                                             self.timeout, self.address, self._hold)
        return resp if self.typed else response_dict(resp)

    async def decide_batch(self, states: list, questions: dict, **controls) -> Any:
        req = build_batch(states, questions, **controls)
        resp = await _acall_with_retries(lambda t: self._decisions.DecideBatch(req, timeout=t, metadata=self._md),
                                         self.timeout, self.address, self._hold)
        return resp if self.typed else batch_dict(resp)

    async def status(self) -> decision_pb2.StatusEvent:
        return await self._status.GetStatus(status_pb2.StatusRequest(), timeout=self.timeout)

    async def watch(self, heartbeat_s: float = 2.0) -> AsyncIterator[decision_pb2.StatusEvent]:
        async for ev in self._status.Watch(status_pb2.StatusRequest(heartbeat_s=heartbeat_s)):
            yield ev
