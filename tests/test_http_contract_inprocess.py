"""The HTTP contract's decision tables (test_http_contract.py) against the gateway's app built in
this process: `build_app` over the same `Decider` on `InProcessServices`, torch and MLX, with no
socket and no child process. The real `laya-grpc serve` answers the same tables in
test_http_contract.py; this covers what the app itself decides (parsing, validation, routing,
decoding, auth, the JSON bytes) in the fast tier."""
from __future__ import annotations

import pytest

pytest.importorskip("laya")

from laya_grpc.cli.predictor import load_services  # noqa: E402
from laya_grpc.core.runtime import flags  # noqa: E402
from laya_grpc.core.decisions.routing import RouteTable  # noqa: E402
from laya_grpc.engine.decider import Decider  # noqa: E402
from laya_grpc.gateway.admission import Admission  # noqa: E402
from laya_grpc.gateway.http_app import build_app  # noqa: E402
from laya_grpc.gateway.policy import Auth, Policy  # noqa: E402
from laya_grpc.gateway.readiness import Readiness  # noqa: E402
from laya_grpc.gateway.settings import GatewaySettings  # noqa: E402
from test_http_contract import (BATCH, ERRORS, HAPPY, _backends, checkpoints, compare, upstream,  # noqa: E402,F401
                                upstream_router)


def gateway_settings(env: dict) -> GatewaySettings:
    """The gateway's settings as `laya-grpc gateway` resolves them under `env`, with no flags."""
    p = flags.Parser(prog="gateway")
    flags.add_settings(p, GatewaySettings)
    return flags.finish(p, p.parse_args([]), env=env).settings


@pytest.fixture(scope="module", params=_backends())
def app(request, checkpoints):  # noqa: F811 - the fixture imported above
    """env -> a client on our HTTP app built under that environment, over in-process services."""
    from starlette.testclient import TestClient
    services = load_services(checkpoints, backend=request.param)
    clients: dict = {}

    def get(env: dict | None = None):
        key = tuple(sorted((env or {}).items()))
        if key not in clients:
            settings = gateway_settings(dict(env or {}))
            decider = Decider(services, RouteTable.build(checkpoints, settings.default_model), settings)
            policy = Policy(Auth(settings.api_key), Admission(settings.admission), Readiness(services))
            clients[key] = TestClient(build_app(decider, settings, policy), follow_redirects=False).__enter__()
        return clients[key]

    yield get
    for client in clients.values():
        client.__exit__(None, None, None)


@pytest.mark.parametrize("name", sorted(HAPPY))
def test_answers_match_upstream(app, upstream, name):  # noqa: F811
    assert compare(app, upstream, HAPPY[name]).status_code == 200


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_match_upstream(app, upstream, name):  # noqa: F811
    ours = compare(app, upstream, ERRORS[name])
    assert ours.status_code in (400, 413, 422)
    assert list(ours.json()) == ["detail"] and isinstance(ours.json()["detail"], str)


@pytest.mark.parametrize("name", sorted(BATCH))
def test_batch_matches_upstream(app, upstream, name):  # noqa: F811
    compare(app, upstream, BATCH[name], path="/v1/systemone/batch")


@pytest.mark.parametrize("name", ["mixed", "min_conf_map", "choice_mixed_labels", "empty_questions"])
def test_strict_projection_matches_upstream(app, upstream, name):  # noqa: F811
    ours = compare(app, upstream, HAPPY[name], env={"LAYA_JEV_STRICT": "1"})
    assert list(ours.json()) == ["model", "answers", "usage"]
