"""One error type for the whole project, mapped once to HTTP and once to gRPC.

Every layer raises `LayaError(kind, detail)`; the gateway turns it into upstream's
`{"detail": ...}` with the kind's HTTP status (`gateway/http_app.error_response`), the gRPC
servicers into the kind's status code with `google.rpc.Status` details
(`laya_grpc.core.wire.rpc.status_of`). BUSY, "busy or restarting, retry", is the one retryable kind:
HTTP 503 with `Retry-After`, gRPC UNAVAILABLE (the code gRPC retry policies retry) with
RetryInfo and `retry-after` metadata.
`detail` texts follow upstream `laya serve` 0.4.15 wherever upstream has one.
"""
from __future__ import annotations

import enum

from typing import Optional

import grpc


class Kind(enum.Enum):
    #            http, grpc status
    BAD_REQUEST = (400, grpc.StatusCode.INVALID_ARGUMENT)       # malformed body / missing fields
    UNAUTHENTICATED = (401, grpc.StatusCode.UNAUTHENTICATED)
    NOT_FOUND = (404, grpc.StatusCode.NOT_FOUND)
    TIMEOUT = (408, grpc.StatusCode.DEADLINE_EXCEEDED)
    TOO_LARGE = (413, grpc.StatusCode.RESOURCE_EXHAUSTED)       # over a size/count limit
    INVALID = (422, grpc.StatusCode.INVALID_ARGUMENT)           # well-formed but semantically bad
    BUSY = (503, grpc.StatusCode.UNAVAILABLE)                   # admission full / not ready; retry
    CHECKPOINT = (500, grpc.StatusCode.FAILED_PRECONDITION)     # a checkpoint on disk is unusable
    DEVICE = (500, grpc.StatusCode.FAILED_PRECONDITION)         # asked device not available
    INTERNAL = (500, grpc.StatusCode.INTERNAL)

    @property
    def http_status(self) -> int:
        return self.value[0]

    @property
    def grpc_code(self) -> grpc.StatusCode:
        return self.value[1]


_BY_GRPC = {}
for _k in Kind:
    _BY_GRPC.setdefault(_k.grpc_code, _k)


class LayaError(Exception):
    """A failure with a user-facing `detail` and a `kind` that fixes its HTTP and gRPC status."""

    def __init__(self, kind: Kind, detail: str, field: str = ""):
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.field = field    # the request field at fault, as a path ("questions[0].criteria[1].label"); "" = unknown
        self.retry_after_s: Optional[float] = None   # the RetryInfo delay it came with, read by clients

    def __repr__(self) -> str:
        return "LayaError(%s, %r%s)" % (self.kind.name, self.detail, ", field=%r" % self.field if self.field else "")


class CheckpointError(LayaError):
    """A checkpoint directory is missing a file or has a bad config/tensor; names file and problem."""

    def __init__(self, path: str, problem: str):
        super().__init__(Kind.CHECKPOINT, "%s: %s" % (path, problem))
        self.path = path
        self.problem = problem


# gRPC trailing-metadata key that carries the Kind name, so an error crossing a service boundary
# keeps its exact kind (INVALID 422 and BAD_REQUEST 400 share INVALID_ARGUMENT).
KIND_METADATA_KEY = "laya-error-kind"

# google.rpc.ErrorInfo.domain of every error this project raises; ErrorInfo.reason is the Kind name.
ERROR_DOMAIN = "laya-grpc"

# RetryInfo's delay on a retryable failure (BUSY: admission full, a backend restarting): long
# enough for a supervised child to come back, short against a client's deadline.
RETRY_DELAY_S = 1.0
RETRY_AFTER_HEADER = "%d" % RETRY_DELAY_S   # HTTP Retry-After and gRPC `retry-after` metadata (upstream's "1")
RETRY_AFTER_KEY = "retry-after"
BUSY_DETAIL = "server busy, try again later"   # upstream's 503 detail


def from_grpc(code: grpc.StatusCode, details: str, kind_name: str | None = None, field: str = "") -> LayaError:
    """Rebuild a LayaError from a gRPC failure seen by a client of one of our services."""
    if kind_name and kind_name in Kind.__members__:
        return LayaError(Kind[kind_name], details or "", field)
    return LayaError(_BY_GRPC.get(code, Kind.INTERNAL), details or code.name)
