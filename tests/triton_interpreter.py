"""Import this first in a test file that runs the Triton kernels on CPU, through Triton's interpreter.

It sets TRITON_INTERPRET=1 before triton is imported: triton.language's own jit functions (tl.max,
tl.sum, ...) become interpretable only if the flag is set when triton.language is first imported.
`require()` skips without torch or triton, and fails loudly (instead of crashing in a kernel) when
another module imported triton before the flag was set.
"""
from __future__ import annotations

import os
import sys

import pytest

_ALREADY_IMPORTED = "triton" in sys.modules
os.environ["TRITON_INTERPRET"] = "1"


def require() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from triton.runtime.interpreter import InterpretedFunction
    import triton.language as tl
    if not (isinstance(tl.max, InterpretedFunction) and isinstance(tl.sum, InterpretedFunction)):
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set (imported already: %s), so triton.language's "
            "jit functions cannot run in the CPU interpreter: set TRITON_INTERPRET=1 in the environment, or "
            "collect this file before any other that imports triton" % _ALREADY_IMPORTED)
