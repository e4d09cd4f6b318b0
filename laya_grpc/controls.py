"""Per-request controls shared by the HTTP gateway and the offline `laya-grpc predict`.

Both read the same `/v1/systemone`-shaped body, so both must refuse a bad `max_len` /
`head_max_len` with the same 422 text `laya serve` gives. No torch here (the gateway imports it).
"""
from __future__ import annotations

from typing import Optional

from .errors import Kind, LayaError


def token_budget(body: dict, key: str, cap: Optional[int] = None) -> Optional[int]:
    """`body[key]` (`max_len` / `head_max_len`): None when absent or null, else a positive int no
    larger than `cap` (the server's limit; None = no limit), else 422 with serve's text."""
    val = body.get(key)
    if val is None:
        return None
    if not isinstance(val, int) or isinstance(val, bool):
        raise LayaError(Kind.INVALID, "%s must be an integer" % key)
    if val <= 0:
        raise LayaError(Kind.INVALID, "%s must be a positive integer" % key)
    if cap is not None and val > cap:
        raise LayaError(Kind.INVALID, "%s exceeds server limit (%d > %d)" % (key, val, cap))
    return val
