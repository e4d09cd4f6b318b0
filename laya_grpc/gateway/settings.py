"""Gateway settings: upstream `laya serve` 0.4.15's environment variables, read once.

Each reader copies upstream's parsing (`laya/serve.py` `_resolve_*`): a blank or unparseable
numeric knob falls back to its default exactly where upstream does, and the variables upstream
refuses to start on (`LAYA_EXTRA_MODELS`, `LAYA_DEFAULT_MODEL` via the route table) raise here.
Upstream re-reads `LAYA_JEV_STRICT`, `LAYA_MAX_TOKEN_BUDGET` and `LAYA_MAX_BATCH_TOKENS` per
request; we read them at start-up, which only differs if the process environment is edited live.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .admission import Limits

DEFAULT_BODY_READ_TIMEOUT = 10.0
DEFAULT_MAX_TOKEN_BUDGET = 8192
DEFAULT_MAX_BATCH_TOKENS = 131072


def _env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    """Upstream `_env_bool`: unset or blank is the default; only 1/true/yes/on turn it on."""
    v = env.get(name)
    if v is None or not v.strip():
        return default
    return v.strip().lower() in ("1", "true", "yes", "on")


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        n = int(str(raw).strip())
    except ValueError:
        return default
    return n if n > 0 else default


def _non_negative_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    try:
        n = int(str(raw).strip()) if raw else default
    except ValueError:
        return default
    return n if n >= 0 else default


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    try:
        value = float(raw) if raw and raw.strip() else default
    except ValueError:
        return default
    return value if 0.0 < value < float("inf") else default


def _admission(env: Mapping[str, str]) -> Limits:
    """The admission queue and budgets (gateway/admission.py); `LAYA_MAX_CONCURRENT` is upstream's
    variable, here the requests answered at once before the rest wait in the queue."""
    d = Limits()
    return Limits(max_concurrent=_positive_int(env, "LAYA_MAX_CONCURRENT", d.max_concurrent),
                  max_queue=_non_negative_int(env, "LAYA_MAX_QUEUE", d.max_queue),
                  queue_timeout_s=_positive_float(env, "LAYA_QUEUE_TIMEOUT_S", d.queue_timeout_s),
                  max_rows=_positive_int(env, "LAYA_MAX_ROWS_IN_FLIGHT", d.max_rows),
                  small_rows=_non_negative_int(env, "LAYA_SMALL_REQUEST_ROWS", d.small_rows))


def _body_read_timeout(env: Mapping[str, str]) -> float:
    raw = env.get("LAYA_BODY_READ_TIMEOUT")
    if not raw or not raw.strip():
        return DEFAULT_BODY_READ_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        return DEFAULT_BODY_READ_TIMEOUT
    return value if 0.0 < value < float("inf") else DEFAULT_BODY_READ_TIMEOUT


def _extra_models(env: Mapping[str, str]) -> dict[str, Any]:
    """`LAYA_EXTRA_MODELS` JSON `{name: source | [repo, subfolder]}`; malformed refuses to start."""
    raw = env.get("LAYA_EXTRA_MODELS", "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as error:
        raise SystemExit("invalid LAYA_EXTRA_MODELS: not a JSON object (%s)" % error) from None
    if not isinstance(data, dict):
        raise SystemExit("invalid LAYA_EXTRA_MODELS: a JSON object {name: source}, got %s"
                         % type(data).__name__)
    out: dict[str, Any] = {}
    for name, source in data.items():
        if isinstance(source, list):
            out[name] = tuple(source)
        elif isinstance(source, str):
            out[name] = source
        else:
            raise SystemExit("invalid LAYA_EXTRA_MODELS: source for %r must be a repo id, a local "
                             "path, or a [repo, subfolder] pair; got %s" % (name, type(source).__name__))
    return out


def _tournament_group(env: Mapping[str, str]) -> int:
    """Upstream's valid range is 2..100; we do not implement elimination, so a valid value refuses."""
    raw = env.get("LAYA_TOURNAMENT_GROUP")
    if not raw:
        return 0
    try:
        n = int(raw)
    except ValueError:
        return 0
    if 2 <= n <= 100:
        raise SystemExit("LAYA_TOURNAMENT_GROUP=%s: tournament elimination is not implemented by "
                         "laya-grpc; unset it" % raw)
    return 0


@dataclass(frozen=True)
class GatewaySettings:
    api_key: Optional[str] = None            # LAYA_API_KEY: bearer auth on the decision routes
    admission: Limits = field(default_factory=Limits)     # LAYA_MAX_CONCURRENT, LAYA_MAX_QUEUE, ...
    body_read_timeout: float = DEFAULT_BODY_READ_TIMEOUT  # LAYA_BODY_READ_TIMEOUT: 408 deadline
    max_token_budget: int = DEFAULT_MAX_TOKEN_BUDGET      # LAYA_MAX_TOKEN_BUDGET: max_len ceiling
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS      # LAYA_MAX_BATCH_TOKENS: batch pass size
    jev_strict: bool = False                 # LAYA_JEV_STRICT: strict Jev projection
    auto_task: bool = False                  # LAYA_AUTO_TASK: workflow-id routing
    default_model: Optional[str] = None      # LAYA_DEFAULT_MODEL (validated by the route table)
    extra_models: dict[str, Any] = field(default_factory=dict)  # LAYA_EXTRA_MODELS
    root_path: str = ""                      # LAYA_ROOT_PATH: uvicorn root_path

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "GatewaySettings":
        env = os.environ if env is None else env
        _tournament_group(env)
        default_model = env.get("LAYA_DEFAULT_MODEL")
        return cls(
            api_key=env.get("LAYA_API_KEY") or None,
            admission=_admission(env),
            body_read_timeout=_body_read_timeout(env),
            max_token_budget=_positive_int(env, "LAYA_MAX_TOKEN_BUDGET", DEFAULT_MAX_TOKEN_BUDGET),
            max_batch_tokens=_positive_int(env, "LAYA_MAX_BATCH_TOKENS", DEFAULT_MAX_BATCH_TOKENS),
            jev_strict=_env_bool(env, "LAYA_JEV_STRICT", False),
            auto_task=_env_bool(env, "LAYA_AUTO_TASK", False),
            default_model=default_model.strip() if default_model and default_model.strip() else None,
            extra_models=_extra_models(env),
            root_path=env.get("LAYA_ROOT_PATH", ""),
        )
