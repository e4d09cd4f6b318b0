"""Per-request controls shared by the HTTP gateway and the offline `laya-grpc predict`.

Both read the same `/v1/systemone`-shaped body, so both must refuse a bad `max_len` /
`head_max_len` with the same 422 text `laya serve` gives. No torch here (the gateway imports it).
"""
from __future__ import annotations

import re
from typing import Any, Optional

from ..errors import Kind, LayaError

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
LONE_SURROGATE_DETAIL = ("request body contains an unpaired surrogate escape; "
                         "those cannot be encoded as UTF-8")


def has_lone_surrogate(value: Any) -> bool:
    """Any string or key anywhere holding an unpaired surrogate (cannot be encoded as UTF-8)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False



def token_budget(body: dict, key: str, cap: Optional[int] = None) -> Optional[int]:
    """`body[key]` (`max_len` / `head_max_len`): None when absent or null, else a positive int no
    larger than `cap` (the server's limit; None = no limit), else 422 with serve's text."""
    val = body.get(key)
    if val is None:
        return None
    if not isinstance(val, int) or isinstance(val, bool):
        raise LayaError(Kind.INVALID, "%s must be an integer" % key, key)
    if val <= 0:
        raise LayaError(Kind.INVALID, "%s must be a positive integer" % key, key)
    if cap is not None and val > cap:
        raise LayaError(Kind.INVALID, "%s exceeds server limit (%d > %d)" % (key, val, cap), key)
    return val
