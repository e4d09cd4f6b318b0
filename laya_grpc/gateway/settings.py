"""The gateway's settings; its flags and environment variables are generated from them.

Upstream `laya serve` 0.4.15's own variables (LAYA_API_KEY, LAYA_MAX_CONCURRENT, ...) keep their
names, and `env_parse` copies upstream's parsing (`laya/serve.py` `_resolve_*`): a blank or
unparseable numeric value falls back to its default exactly where upstream does, and the variables
upstream refuses to start on (LAYA_EXTRA_MODELS, LAYA_DEFAULT_MODEL via the route table,
LAYA_TOURNAMENT_GROUP) refuse here. Upstream re-reads LAYA_JEV_STRICT and LAYA_MAX_TOKEN_BUDGET per
request; we read them at start-up, which only differs if the process environment is edited live.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from laya_grpc.core.runtime.flags import USE_DEFAULT, non_negative_int, positive_int, positive_seconds, setting
from laya_grpc.core.runtime.settings import (ServiceSettings, upstream_as_is, upstream_bool, upstream_positive_int,
                                    upstream_seconds, upstream_text)

from .admission import Limits
from .conn_limits import DEFAULT_GRPC_MAX_CONNECTIONS, HANDSHAKE_TIMEOUT_S, MAX_IDLE_S

DEFAULT_BODY_READ_TIMEOUT = 10.0
DEFAULT_MAX_TOKEN_BUDGET = 8192
# Long enough for a large batch on a CPU-only inference service; short enough that the gateway does
# not keep working for a client that has left (proxies in front commonly give up at 60 s).
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024


def upstream_port(raw: str):
    """`LAYA_PORT` as upstream reads it: blank is the default, anything else must be a port."""
    if not raw.strip():
        return USE_DEFAULT
    port = int(raw.strip())
    if not 0 < port < 65536:
        raise ValueError("a port is 1..65535")
    return port


def port_number(text: str) -> int:
    n = positive_int(text)
    if n > 65535:
        raise ValueError("a port is 1..65535")
    return n


@dataclass
class GatewayOptions:
    """What the gateway serves and how; `serve` passes these to each gateway worker."""
    SECTION = "gateway"

    http: str = setting("127.0.0.1:8000", "HOST:PORT for HTTP /v1/systemone, /v1/systemone/batch and /health",
                        metavar="HOST:PORT")
    grpc: str = setting("127.0.0.1:50051", "HOST:PORT (or unix:/path) for the gRPC DecisionService, "
                        "StatusService and grpc.health.v1", metavar="ADDRESS")
    host: Optional[str] = setting(None, "the interface HTTP and gRPC listen on, replacing the host of --http "
                                  "and --grpc (0.0.0.0: every interface)", env="LAYA_HOST",
                                  env_parse=upstream_text)
    port: Optional[int] = setting(None, "the HTTP port, replacing the port of --http", type=port_number,
                                  env="LAYA_PORT", env_parse=upstream_port)
    grpc_port: Optional[int] = setting(None, "the gRPC port, replacing the port of --grpc", type=port_number)
    api_key: Optional[str] = setting(None, "require 'Authorization: Bearer KEY' (HTTP) or the 'authorization' "
                                     "metadata (gRPC) on the decision routes", env="LAYA_API_KEY",
                                     env_parse=upstream_as_is, secret=True, metavar="KEY")
    max_concurrent: int = setting(Limits.max_concurrent, "decision requests (HTTP and gRPC together) answered "
                                  "at once; more wait in the admission queue (upstream's variable, whose own "
                                  "default of 16 refused the 17th at once)", name="max_concurrent_requests",
                                  type=positive_int, env="LAYA_MAX_CONCURRENT", env_parse=upstream_positive_int,
                                  metavar="N")
    max_queue: int = setting(Limits.max_queue, "requests waiting for admission at most; one more is refused "
                             "(HTTP 503 with Retry-After, gRPC UNAVAILABLE with RetryInfo); 0 refuses at once "
                             "when every slot is taken, as upstream does", type=non_negative_int, metavar="N")
    queue_timeout_s: float = setting(Limits.queue_timeout_s, "longest wait in the admission queue (never past "
                                     "the request's own deadline) before the busy answer", type=positive_seconds,
                                     unit="seconds", name="queue_timeout_seconds")
    max_rows_in_flight: int = setting(Limits.max_rows, "rows (state x question pairs) that the larger requests "
                                      "answered at once may hold together; a larger request waits for rows "
                                      "while small ones pass", type=positive_int)
    small_request_rows: int = setting(Limits.small_rows, "requests of at most this many rows never wait for "
                                      "rows (only for a slot)", type=non_negative_int, unit="rows")
    proxied_clients: bool = setting(False, "clients reach the gateway through a proxy that carries many of them "
                                    "on one connection: a refusal's retry delay then binds no connection (a "
                                    "re-send before it still queues); without this, a request sent on a "
                                    "connection before its retry delay has passed gets no queue place")
    strict_model: bool = setting(False, "answer a request whose 'model' names no checkpoint served here with 404 "
                                 "(gRPC NOT_FOUND) instead of routing it automatically as upstream laya serve "
                                 "does (the default; the response then names the unknown model in the "
                                 "X-Laya-Unknown-Model header)")
    body_read_timeout: float = setting(DEFAULT_BODY_READ_TIMEOUT, "time a request may take to deliver its body "
                                       "before the gateway answers 408 and frees its slot",
                                       name="body_read_timeout_seconds", unit="seconds", type=positive_seconds,
                                       env="LAYA_BODY_READ_TIMEOUT", env_parse=upstream_seconds)
    max_token_budget: int = setting(DEFAULT_MAX_TOKEN_BUDGET, "ceiling on a request's max_len and "
                                    "head_max_len", name="max_token_budget", type=positive_int, unit="tokens",
                                    env="LAYA_MAX_TOKEN_BUDGET", env_parse=upstream_positive_int)
    jev_strict: bool = setting(False, "serve the strict Jev wire contract: no root routing, no per-answer "
                               "action or answer_confidence, no confidence on noul answers, usage reduced to "
                               "input_tokens and output_tokens", env="LAYA_JEV_STRICT", env_parse=upstream_bool)
    auto_task: bool = setting(False, "route workflow-id states to the typed-decisions checkpoint",
                              env="LAYA_AUTO_TASK", env_parse=upstream_bool)
    default_model: Optional[str] = setting(None, "the checkpoint for states with no language evidence "
                                           "(upstream's default: multilingual)", env="LAYA_DEFAULT_MODEL",
                                           env_parse=upstream_text, metavar="NAME")
    root_path: str = setting("", "public URL prefix when behind a reverse proxy", env="LAYA_ROOT_PATH",
                             env_parse=upstream_as_is, metavar="PATH")
    request_timeout_s: float = setting(DEFAULT_REQUEST_TIMEOUT_S, "HTTP decision requests fail 408 after this "
                                       "long; the backend calls get what is left as their gRPC deadline (gRPC "
                                       "clients set their own deadline); 0 = no limit", type=float,
                                       unit="seconds", name="request_timeout_seconds",
                                       deprecated=("--request-timeout-s", "LAYA_REQUEST_TIMEOUT_S"))
    http_header_timeout: float = setting(DEFAULT_HEADER_TIMEOUT_S, "close an HTTP connection that has not sent "
                                         "a request's complete headers this long after it opened (or after the "
                                         "request's first byte): a silent or slow client holds no socket",
                                         type=positive_seconds, unit="seconds",
                                         name="http_header_timeout_seconds",
                                         deprecated=("--http-header-timeout", "LAYA_HTTP_HEADER_TIMEOUT"))
    http_idle_timeout: float = setting(DEFAULT_IDLE_TIMEOUT_S, "close a kept-alive HTTP connection after this "
                                       "long without a new request", type=positive_seconds, unit="seconds",
                                       name="http_idle_timeout_seconds",
                                       deprecated=("--http-idle-timeout", "LAYA_HTTP_IDLE_TIMEOUT"))
    http_max_connections: int = setting(DEFAULT_MAX_CONNECTIONS, "open HTTP connections at most; one more is "
                                        "closed at once (requests among the open ones are bounded by "
                                        "--max-concurrent-requests)", type=positive_int, metavar="N")
    grpc_max_connections: int = setting(DEFAULT_GRPC_MAX_CONNECTIONS, "open gRPC connections at most; one more "
                                        "is closed at once. A connection that has not finished its HTTP/2 "
                                        "handshake within %.0f s is closed, one without calls for %.0f s is asked "
                                        "to reconnect (GOAWAY)" % (HANDSHAKE_TIMEOUT_S, MAX_IDLE_S),
                                        type=positive_int, metavar="N")

    @property
    def admission(self) -> Limits:
        """The admission queue's limits (gateway/admission.py)."""
        return Limits(max_concurrent=self.max_concurrent, max_queue=self.max_queue,
                      queue_timeout_s=self.queue_timeout_s, max_rows=self.max_rows_in_flight,
                      small_rows=self.small_request_rows, connection_delays=not self.proxied_clients)

    def complete(self, sources: dict) -> None:
        """--host, --port and --grpc-port replace their part of --http and --grpc."""
        super().complete(sources)   # type: ignore[misc]
        if self.host is not None or self.port is not None:
            self.http = _replace(self.http, self.host, self.port)
            _derived(sources, "http", self.http, ("port", "host"))
        if (self.host is not None or self.grpc_port is not None) and not self.grpc.startswith("unix:"):
            self.grpc = _replace(self.grpc, self.host, self.grpc_port)
            _derived(sources, "grpc", self.grpc, ("grpc_port", "host"))
        refuse_unsupported()


def _derived(sources: dict, name: str, value: str, parts: tuple) -> None:
    """Where `name` came from when --host/--port changed it: the first of `parts` that was given."""
    if name not in sources:
        return
    sources[name].value = value
    for part in parts:
        r = sources.get(part)
        if r is not None and r.source != "default":
            sources[name].source, sources[name].via = r.source, r.via
            return


def _replace(address: str, host: Optional[str], port: Optional[int]) -> str:
    old_host, _, old_port = address.rpartition(":")
    host = host if host is not None else old_host
    if ":" in host and not host.startswith("["):
        host = "[%s]" % host    # an IPv6 literal
    return "%s:%s" % (host, port if port is not None else old_port)


def refuse_unsupported(env: Optional[Mapping[str, str]] = None) -> None:
    """LAYA_TOURNAMENT_GROUP: upstream's valid range is 2..100; we do not implement elimination, so a
    valid value refuses to start (an invalid one is ignored, as upstream ignores it)."""
    raw = (os.environ if env is None else env).get("LAYA_TOURNAMENT_GROUP")
    try:
        n = int(raw or "")
    except ValueError:
        return
    if 2 <= n <= 100:
        raise SystemExit("LAYA_TOURNAMENT_GROUP=%s: tournament elimination is not implemented by "
                         "laya-grpc; unset it" % raw)


@dataclass
class GatewaySettings(GatewayOptions, ServiceSettings):
    SECTION = "this process"

    tokenizer: list = setting(["127.0.0.1:50053"], "tokenizer service address; several replicas: repeat the "
                              "flag or give a comma list of HOST:PORT or unix:/path, or dns:///NAME:PORT (every "
                              "address the name resolves to, re-resolved by gRPC); calls are spread over the "
                              "replicas that report SERVING and a call that fails UNAVAILABLE is retried once "
                              "on another. ipc:///PATH?grpc=ADDRESS sends Tokenize calls over that unix socket "
                              "(same host) and keeps health on the gRPC ADDRESS", repeatable=True,
                              metavar="ADDRESS", deprecated=("LAYA_TOKENIZER_ADDRESSES",))
    inference: str = setting("127.0.0.1:50052", "inference service address, with replicas as for --tokenizer; "
                             "every replica must serve the same checkpoint set", metavar="ADDRESS",
                             deprecated=("LAYA_INFERENCE_ADDRESS",))
    metrics: Optional[str] = setting(None, "serve this process's Prometheus metrics on this address (off by "
                                     "default)", metavar="HOST:PORT", deprecated=("LAYA_GATEWAY_METRICS",))
    control: Optional[str] = setting(None, "a second gRPC address (unix:/path.sock) reaching this worker alone, "
                                     "also when several share --grpc, to see its own readiness and status; "
                                     "'serve' gives each gateway worker one in its run dir and reports ready "
                                     "once every worker is", metavar="ADDRESS",
                                     deprecated=("LAYA_GATEWAY_CONTROL",))
    reuse_port: bool = setting(False, "share the --http and --grpc ports with other gateway processes "
                               "(SO_REUSEPORT; the kernel spreads connections); 'serve --gateway-workers N' "
                               "sets it", deprecated=("LAYA_GATEWAY_REUSE_PORT",))
