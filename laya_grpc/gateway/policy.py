"""The gateway's policy: who may call (bearer auth), when a request may run (admission) and
whether the gateway serves at all (readiness), as one object that both fronts call.

    policy.auth.check(authorization_header)            # UNAUTHENTICATED unless the key matches
    async with policy.admission.enter(client, conn) as t:   # a slot, waiting in the bounded queue
        ...; await t.charge(rows)                      # the request's rows
    policy.readiness.ready() / .reason()

Each refusal is a LayaError whose kind fixes its HTTP status and gRPC code in one place
(`core/errors.py`): 401 / UNAUTHENTICATED, 503 + Retry-After / UNAVAILABLE + RetryInfo.
"""
from __future__ import annotations

import hmac
from typing import Optional, Union

from laya_grpc.core.errors import Kind, LayaError

from .admission import Admission
from .readiness import Readiness

UNAUTHORIZED_DETAIL = "invalid or missing bearer token"


class Auth:
    """The bearer check of `LAYA_API_KEY`. Bytes on both sides (surrogateescape): a str
    compare_digest raises on non-ASCII, so this way any header a client can send is a plain
    mismatch; the compare takes the same time wherever the first difference is."""

    def __init__(self, api_key: Optional[str]):
        self.api_key = api_key
        self._expected = ("Bearer " + api_key).encode("utf-8", "surrogateescape") if api_key else None

    @property
    def required(self) -> bool:
        return self._expected is not None

    def allows(self, supplied: Union[str, bytes, None]) -> bool:
        if self._expected is None:
            return True
        if isinstance(supplied, bytes):
            supplied = supplied.decode("latin-1")
        return hmac.compare_digest((supplied or "").encode("utf-8", "surrogateescape"), self._expected)

    def check(self, supplied: Union[str, bytes, None]) -> None:
        if not self.allows(supplied):
            raise LayaError(Kind.UNAUTHENTICATED, UNAUTHORIZED_DETAIL)


def bearer_of(metadata) -> Optional[str]:
    """The `authorization` value of gRPC invocation metadata (the last one given)."""
    supplied = None
    for key, value in metadata or ():
        if key == "authorization":
            supplied = value
    return supplied


class Policy:
    """Auth, admission and readiness of one gateway process, composed."""

    def __init__(self, auth: Auth, admission: Admission, readiness: Readiness):
        self.auth, self.admission, self.readiness = auth, admission, readiness
