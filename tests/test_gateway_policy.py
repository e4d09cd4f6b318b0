"""The gateway's policy object: bearer auth and readiness as both fronts see them."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.gateway.policy import Auth, bearer_of
from laya_grpc.gateway.readiness import Readiness


def test_auth_compares_any_header_without_raising():
    auth = Auth("k\u00e9y")
    assert auth.allows("Bearer k\u00e9y")
    for bad in (None, "", "Bearer", "Bearer k\u00e9y ", b"\xff\xfe", "Bearer \udcff"):
        assert not auth.allows(bad)
    with pytest.raises(LayaError) as e:
        auth.check("Bearer nope")
    assert e.value.kind is Kind.UNAUTHENTICATED
    assert Auth(None).allows(None) and not Auth(None).required
    assert bearer_of((("x", "1"), ("authorization", "Bearer a"))) == "Bearer a" and bearer_of(None) is None


def _backends(tok_detail: str):
    tok = SimpleNamespace(serving=False, address="unix:/tmp/run-x/tokenizer-0.sock", detail=tok_detail, status=None)
    return SimpleNamespace(tokenizers=[tok], inferences=[], backends_ready=lambda: False)


def test_the_not_ready_reason_names_no_socket_path():
    r = Readiness(_backends("unreachable: failed to connect to all addresses; last error: UNKNOWN: "
                            "unix:/tmp/run-x/tokenizer-0.sock: No such file or directory"))
    reason = r.reason()
    assert reason.startswith("no tokenizer serving (local socket: unreachable") and "/tmp" not in reason, reason
    assert "No such file or directory" in reason and not r.ready()
    r.draining = True
    assert r.reason() == "draining: shutting down"
