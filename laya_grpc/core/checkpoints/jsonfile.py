"""Read a checkpoint's JSON config files, failing with a `CheckpointError` that names the file.

Every reader of a checkpoint (validation, tokenizer, networks, offline pipeline) goes through
`read_json_object`, so a missing, unreadable or malformed file gives the same error wherever it
is found first.
"""
from __future__ import annotations

import json

from ..errors import CheckpointError


def read_json_object(path: str) -> dict:
    """The JSON object in `path`; CheckpointError(path, ...) when missing, unreadable, invalid or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(path, "file is missing") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(path, "unreadable: %s" % e) from None
    except json.JSONDecodeError as e:
        raise CheckpointError(path, "invalid JSON: %s" % e) from None
    if not isinstance(obj, dict):
        raise CheckpointError(path, "expected a JSON object, found %s" % type(obj).__name__)
    return obj
