"""The CUDA kernels compile for an H100/H200 (sm_90) on this CPU-only machine: Triton's own compiler,
front end to cubin with its bundled ptxas, no GPU needed.

Why: the other kernel tests run the kernels through Triton's interpreter, which executes the Python
and resolves names differently from the compiler (a helper called from another module, a constexpr
branch, an input precision the interpreter ignores). A kernel that runs interpreted but does not
compile would fail the service's start on every GPU. Each variant compiled here is one the fast
mode (16-bit) or the exact mode (float32, split GEMM inputs) launches. It runs in a child process,
since a test process that imported `triton_interpreter` has Triton in interpreter mode.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

CHILD = r'''
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from laya_grpc.inference import cuda_attention as ca, cuda_kernels as ck

target = GPUTarget("cuda", 90, 32)
_, rope, gelu = ck._kernels()
_, norm = ck._norm_kernel()
_, split = ck._split_kernel()
_, attn = ca._kernel()

def compile_(name, fn, sig, consts):
    sig = dict(sig, **{k: "constexpr" for k in consts})
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
    assert kernel.asm.get("cubin"), name
    print("compiled", name, flush=True)

for t in ("fp16", "fp32"):
    compile_("rope_qk " + t, rope, {"qkv_ptr": "*" + t, "cos_ptr": "*" + t, "sin_ptr": "*" + t, "pos_ptr": "*i64",
             "out_ptr": "*" + t, "n_tokens": "i32", "L": "i32"},
             {"H": 16, "HALF": 32, "BLOCK_H": 16, "BLOCK_HALF": 32, "HAS_POS": False})
for t, s in (("fp16", 0), ("fp32", 0), ("fp32", 2), ("fp32", 3)):
    out = "*fp16" if s else "*" + t
    compile_("gelu_gate %s split %d" % (t, s), gelu, {"x_ptr": "*" + t, "out_ptr": out, "inter": "i32"},
             {"BLOCK": 1024, "SPLIT": s})
    for res in (False, True):
        compile_("add_layer_norm %s split %d residual %s" % (t, s, res), norm,
                 {"x_ptr": "*fp32", "o_ptr": "*" + t, "w_ptr": "*" + t, "y_ptr": out, "n_rows": "i32", "d": "i32",
                  "eps": "fp32"}, {"ROWS": 1, "BLOCK": 1024, "HAS_RES": res, "SPLIT": s})
    if s:
        compile_("split_fp16 terms %d" % s, split, {"x_ptr": "*fp32", "out_ptr": "*fp16", "n_rows": "i32", "k": "i32"},
                 {"BLOCK": 1024, "TERMS": s})
    for varlen in (False, True):
        compile_("attention %s split %d varlen %s" % (t, s, varlen), attn,
                 {"qkv_ptr": "*" + t, "cos_ptr": "*" + t, "sin_ptr": "*" + t, "len_ptr": "*i32", "start_ptr": "*i32",
                  "blk_seg_ptr": "*i32", "blk_m0_ptr": "*i32", "out_ptr": out, "L": "i32", "window": "i32",
                  "qk_scale": "fp32", "rope": "i32"},
                 {"H": 16, "HD": 64, "BLOCK_D": 64, "BLOCK_M": 64, "BLOCK_N": 64, "SLIDING": True,
                  "PREC": "tf32x3" if t == "fp32" else None, "FOR_LOOP": True, "VARLEN": varlen, "SPLIT": s})
print("all variants compiled")
'''


def test_kernels_compile_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")   # compile, not read a cache
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "all variants compiled" in out.stdout, out.stdout
