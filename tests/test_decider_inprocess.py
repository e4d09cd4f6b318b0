"""The gateway's `Decider` on in-process services: upstream `laya serve`'s answers without
starting a process (the same Decider the gateway runs over gRPC; test_services_e2e.py covers the
processes)."""
from __future__ import annotations

import asyncio
import json

import pytest

from laya_grpc.cli.predictor import load_services
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.routing import RouteTable
from laya_grpc.gateway.http_body import parse_batch_body, parse_decide_body
from laya_grpc.engine.decider import Decider
from laya_grpc.gateway.settings import GatewaySettings
from test_services_e2e import QUESTIONS, STATES, assert_close, router, upstream_body  # noqa: F401 - router is a fixture


@pytest.fixture(scope="module")
def decider(tiny_ckpt, tiny_ml_ckpt):
    sources = {"english": tiny_ckpt, "multilingual": tiny_ml_ckpt}
    return Decider(load_services(sources), RouteTable.build(sources), GatewaySettings())


def _run(coro):
    return asyncio.new_event_loop().run_until_complete(coro)


@pytest.mark.parametrize("i", [0, 1, 2])
def test_decide_equals_upstream_serve(decider, router, i):  # noqa: F811 - the fixture imported above
    body = json.dumps({"state": STATES[i], "questions": QUESTIONS}).encode()
    ours = _run(decider.decide(parse_decide_body(body, decider.route_table)))
    assert_close(json.loads(json.dumps(ours.body())), upstream_body(router, STATES[i], QUESTIONS))


def test_batch_routes_each_state(decider, router):  # noqa: F811 - the fixture imported above
    body = json.dumps({"states": STATES[:2], "questions": QUESTIONS}).encode()
    ours = json.loads(json.dumps(_run(decider.decide_batch(parse_batch_body(body, decider.route_table))).body()))
    assert [r["routing"]["model"] for r in ours["results"]] == ["english", "multilingual"]
    for state, result in zip(STATES[:2], ours["results"]):
        assert_close(result, upstream_body(router, state, QUESTIONS))


def test_unknown_task_is_upstreams_error(decider):
    body = json.dumps({"state": "x", "questions": QUESTIONS, "task": "nope"}).encode()
    with pytest.raises(LayaError) as err:
        _run(decider.decide(parse_decide_body(body, decider.route_table)))
    assert err.value.kind is Kind.INVALID
