"""Settings every service shares: logging, tracing, draining and the checkpoint set.

Each service's settings class (tokenizer/settings.py, inference/settings.py, gateway/settings.py,
cli/settings.py for `serve`) builds on these; core/runtime/flags.py generates their flags and variables.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from .flags import USE_DEFAULT, setting
from .logs import FORMATS

DEFAULT_GRACE_S = 20.0



@dataclass
class ObservabilitySettings:
    SECTION = "logging and tracing"

    log_format: str = setting("text", "'json' writes one JSON object per line (for log pipelines); 'text' is "
                              "for people. Either way lines about a request carry its request id",
                              choices=FORMATS)
    json_output: bool = setting(False, "the same as --log-format json")
    log_level: str = setting("INFO", "the least severe log level written: DEBUG, INFO, WARNING, ERROR",
                             type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
    access_log: bool = setting(True, "one log line per decision request (--no-access-log turns it off)")
    otlp_endpoint: Optional[str] = setting(None, "send OpenTelemetry traces (one per request, every hop: "
                                           "gateway, tokenize, queue wait, forward, decode) to this OTLP gRPC "
                                           "collector, e.g. http://otel-collector:4317; off by default (needs "
                                           "the 'otel' extra)", metavar="URL")

    def complete(self, sources: dict) -> None:
        if self.json_output:
            self.log_format = "json"


@dataclass
class DrainSettings:
    SECTION = "shutdown"

    drain_grace_s: float = setting(DEFAULT_GRACE_S, "on SIGTERM: report NOT_SERVING at once, then finish "
                                   "in-flight work for at most this long before exiting (keep it below the "
                                   "orchestrator's kill timeout, e.g. Kubernetes' terminationGracePeriodSeconds)",
                                   type=float, unit="seconds", name="drain_grace_seconds",
                                   deprecated=("--drain-grace-s", "LAYA_DRAIN_GRACE_S"))


# How upstream laya reads its own variables (laya/serve.py `_env_bool`, `_resolve_*`).

def upstream_bool(raw: str):
    """Upstream `_env_bool`: blank is the default; only 1/true/yes/on turn it on."""
    if not raw.strip():
        return USE_DEFAULT
    return raw.strip().lower() in ("1", "true", "yes", "on")


def upstream_positive_int(raw: str):
    """Upstream's numeric variables: blank, unparseable or not positive is the default."""
    try:
        n = int(str(raw).strip())
    except ValueError:
        return USE_DEFAULT
    return n if n > 0 else USE_DEFAULT


def upstream_as_is(raw: str):
    """A text variable upstream reads as it is (`LAYA_API_KEY`, `LAYA_ROOT_PATH`); empty is unset."""
    return raw if raw else USE_DEFAULT


def upstream_seconds(raw: str):
    try:
        value = float(raw)
    except ValueError:
        return USE_DEFAULT
    return value if 0.0 < value < float("inf") else USE_DEFAULT


def upstream_text(raw: str):
    return raw.strip() or USE_DEFAULT


def upstream_extra_models(raw: str) -> Any:
    """`LAYA_EXTRA_MODELS` as upstream reads it: a JSON object {name: source | [repo, subfolder]};
    blank is none, anything malformed refuses to start."""
    raw = raw.strip()
    if not raw:
        return USE_DEFAULT
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise SystemExit("invalid LAYA_EXTRA_MODELS: not a JSON object (%s)" % error) from None
    if not isinstance(data, dict):
        raise SystemExit("invalid LAYA_EXTRA_MODELS: a JSON object {name: source}, got %s"
                         % type(data).__name__)
    for name, source in data.items():
        if not isinstance(source, (str, list)):
            raise SystemExit("invalid LAYA_EXTRA_MODELS: source for %r must be a repo id, a local "
                             "path, or a [repo, subfolder] pair; got %s" % (name, type(source).__name__))
    return data


@dataclass
class CheckpointSettings:
    SECTION = "checkpoints"

    checkpoint: list = setting([], "a checkpoint to serve: NAME=DIR (local upstream layout) or "
                               "NAME=ORG/REPO[/SUBFOLDER][@REVISION] (Hugging Face hub, needs the 'hub' extra "
                               "and a network). Default: upstream's english, multilingual and typed-decisions "
                               "from convaiinnovations/laya", repeatable=True, metavar="NAME=SOURCE",
                               deprecated=("LAYA_CHECKPOINTS",))
    extra_models: dict = setting({}, "JSON object {name: source} adding checkpoints to those above (or "
                                 "re-pointing one of the same name), as upstream laya's variable does; "
                                 "served under an explicit model=", type=json.loads, metavar="JSON",
                                 env="LAYA_EXTRA_MODELS", env_parse=upstream_extra_models)

    def checkpoint_sources(self) -> dict:
        """name -> source of every checkpoint served: --checkpoint (or the defaults) and the extras."""
        from ..decisions.routing import canonical_name, source_text
        from ..checkpoints.sources import parse_checkpoint_specs
        sources = parse_checkpoint_specs(self.checkpoint)
        for name, source in (self.extra_models or {}).items():
            sources[canonical_name(name)] = source_text(source)
        return sources


def listen_setting(default: str, service: str) -> Any:
    """The address a tokenizer or inference process serves gRPC on (`--listen`, LAYA_LISTEN)."""
    return setting(default, "address to serve on: HOST:PORT or unix:/path.sock", metavar="ADDRESS",
                   deprecated=("LAYA_%s_LISTEN" % service.upper(),))


def metrics_setting(service: str) -> Any:
    """The address a tokenizer or inference process serves its Prometheus metrics on (`--metrics`)."""
    return setting(None, "serve this process's Prometheus metrics on this address (off by default)",
                   metavar="HOST:PORT", deprecated=("LAYA_%s_METRICS" % service.upper(),))


def ipc_setting(service: str, call: str) -> Any:
    """The unix socket a tokenizer or inference process also takes its `call`s on (`--ipc`)."""
    return setting(None, "also take %s calls on this unix socket (cheaper than gRPC between processes of one "
                   "host; 'serve' uses it for its own children); health, status and the other RPCs stay on "
                   "--listen" % call, metavar="ipc:///PATH", deprecated=("LAYA_%s_IPC" % service.upper(),))


@dataclass
class ServiceSettings(CheckpointSettings, DrainSettings, ObservabilitySettings):
    """What every service process takes."""
