"""JSON scalars on the typed wire: a choice label keeps its JSON type (1, 1.0, true and "1"
render differently to the model), carried as `laya_proto.v1.Label` (a oneof of string, int,
number and bool). Duck-typed on the message, as `question_wire`, so core imports no generated code.
"""
from __future__ import annotations

from typing import Any

from ..errors import Kind, LayaError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def set_label(msg, value: Any, field: str = "") -> None:
    """Write a Python JSON scalar into a Label message (bool before int: True is an int too)."""
    if isinstance(value, str):
        msg.string_value = value
    elif isinstance(value, bool):
        msg.bool_value = value
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise LayaError(Kind.INVALID, "label %d does not fit a 64-bit integer" % value, field)
        msg.int_value = value
    elif isinstance(value, float):
        msg.number_value = value
    else:
        raise LayaError(Kind.INVALID, "a label must be a string, number or bool, got %r" % (value,), field)


def label_value(msg, field: str = "") -> Any:
    """A Label message's Python value; BAD_REQUEST when none of its kinds is set."""
    which = msg.WhichOneof("value")
    if which is None:
        raise LayaError(Kind.BAD_REQUEST, "%s: a label sets one of string_value, int_value, number_value "
                                          "or bool_value" % (field or "label"), field)
    return getattr(msg, which)


def json_key(key: Any) -> str:
    """A dict key as `json.dumps` writes it (labels 1, 2.5, True become "1", "2.5", "true")."""
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return float.__repr__(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    return str(key)
