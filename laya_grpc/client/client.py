"""Python clients for the gateway's gRPC API: blocking (`LayaClient`) and asyncio (`AsyncLayaClient`).

Both take plain Python values (`state` any JSON value, `questions` the /v1/systemone dict),
send them as typed requests (`requests.build_decide`), and return by default the exact
/v1/systemone response dict rebuilt from the typed answer (`answers.response_dict`), so code
written against the HTTP API ports as is. `typed=True` returns the DecideResponse /
DecideBatchResponse messages instead. A failed call raises `laya_grpc.core.errors.LayaError` with
the HTTP-equivalent kind and detail (and `field`, the request field at fault when known).
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Iterator, Optional

import grpc

from laya_grpc.core import rpc
from laya_grpc.core.calls import stream_mux
from laya_proto.v1 import decision_pb2, decision_pb2_grpc, status_pb2

from .answers import batch_dict, response_dict
from .requests import build_batch, build_decide


def _metadata(api_key: Optional[str]):
    return (("authorization", "Bearer " + api_key),) if api_key else None


class LayaClient:
    """Blocking client. `with LayaClient("127.0.0.1:50051") as c: c.decide(state, questions)`.

    `typed=True`: `decide` / `decide_batch` return the typed response messages, not dicts."""

    def __init__(self, address: str = "127.0.0.1:50051", api_key: Optional[str] = None, timeout: float = 60.0,
                 typed: bool = False):
        self._channel = grpc.insecure_channel(rpc.target(address), options=rpc.CHANNEL_OPTIONS)
        self._decisions = decision_pb2_grpc.DecisionServiceStub(self._channel)
        self._status = decision_pb2_grpc.StatusServiceStub(self._channel)
        self._md, self.timeout, self.typed = _metadata(api_key), timeout, typed

    def __enter__(self) -> "LayaClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def decide(self, state: Any, questions: dict, **controls) -> Any:
        """One state; controls: model, task, lang, lang_guess, max_len, head_max_len, min_confidence."""
        try:
            resp = self._decisions.Decide(build_decide(state, questions, **controls), timeout=self.timeout,
                                          metadata=self._md)
        except grpc.RpcError as e:
            raise rpc.error_from_rpc(e, "gateway") from None
        return resp if self.typed else response_dict(resp)

    def decide_batch(self, states: list, questions: dict, **controls) -> Any:
        try:
            resp = self._decisions.DecideBatch(build_batch(states, questions, **controls), timeout=self.timeout,
                                               metadata=self._md)
        except grpc.RpcError as e:
            raise rpc.error_from_rpc(e, "gateway") from None
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
        self._channel = rpc.channel(address)
        self._decisions = decision_pb2_grpc.DecisionServiceStub(self._channel)
        self._status = decision_pb2_grpc.StatusServiceStub(self._channel)
        self._md, self.timeout, self.typed = _metadata(api_key), timeout, typed
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
            resp = await self._mux.call(req, self.timeout)
        else:
            try:
                resp = await self._decisions.Decide(req, timeout=self.timeout, metadata=self._md)
            except grpc.aio.AioRpcError as e:
                raise rpc.error_from_rpc(e, "gateway") from None
        return resp if self.typed else response_dict(resp)

    async def decide_batch(self, states: list, questions: dict, **controls) -> Any:
        try:
            resp = await self._decisions.DecideBatch(build_batch(states, questions, **controls),
                                                     timeout=self.timeout, metadata=self._md)
        except grpc.aio.AioRpcError as e:
            raise rpc.error_from_rpc(e, "gateway") from None
        return resp if self.typed else batch_dict(resp)

    async def status(self) -> decision_pb2.StatusEvent:
        return await self._status.GetStatus(status_pb2.StatusRequest(), timeout=self.timeout)

    async def watch(self, heartbeat_s: float = 2.0) -> AsyncIterator[decision_pb2.StatusEvent]:
        async for ev in self._status.Watch(status_pb2.StatusRequest(heartbeat_s=heartbeat_s)):
            yield ev
