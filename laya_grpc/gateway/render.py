"""Upstream's JSON bytes: Starlette `JSONResponse.render`, which `laya serve` answers with.

Compact separators, raw UTF-8 (no `\\u` escapes), insertion key order, Python float repr, and
`allow_nan=False`: a NaN/Infinity anywhere in a result (a `NaN` choice label becomes a probability
key and the `choice` value) is a 422 upstream, since its handler maps that `ValueError` to 422.
Non-string dict keys are written the way `json.dumps` writes them (`1`, `2.5`, `true` -> `"1"`,
`"2.5"`, `"true"`), including upstream's duplicate keys for labels `1` and `"1"`.
"""
from __future__ import annotations

import json
from typing import Any

from laya_grpc.core.errors import Kind, LayaError

# Python 3.12+ appends ": nan" to this text; upstream's probe (3.11) answered without it.
NAN_DETAIL = "Out of range float values are not JSON compliant"


def render_json(content: Any) -> bytes:
    """The response body bytes, or LayaError(INVALID) for a NaN/Infinity value."""
    try:
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, indent=None,
                          separators=(",", ":"))
    except ValueError as error:
        if str(error).startswith(NAN_DETAIL):
            raise LayaError(Kind.INVALID, NAN_DETAIL) from None
        raise
    return text.encode("utf-8")
