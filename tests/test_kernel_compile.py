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
_, relu = ck._relu_kernel()
_, attn = ca._kernel()

def compile_(name, fn, sig, consts):
    sig = dict(sig, **{k: "constexpr" for k in consts})
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=target)
    assert kernel.asm.get("cubin"), name
    # a kernel that touches no memory compiled to nothing: its constexprs missed a branch the service takes
    ptx = kernel.asm["ptx"]
    assert "st.global" in ptx or "atom.global" in ptx, name
    print("compiled", name, flush=True)

for t in ("fp16", "fp32"):
    compile_("rope_qk " + t, rope, {"qkv_ptr": "*" + t, "cos_ptr": "*" + t, "sin_ptr": "*" + t, "pos_ptr": "*i64",
             "out_ptr": "*" + t, "n_tokens": "i32", "L": "i32"},
             {"H": 16, "HALF": 32, "BLOCK_H": 16, "BLOCK_HALF": 32, "HAS_POS": False})
for t, s in (("fp16", 0), ("fp32", 0), ("fp32", 2), ("fp32", 3)):
    out = "*fp16" if s else "*" + t
    for stack in ((False, True) if s == 2 else (False,)):   # the split form, and its halves as row blocks
        compile_("gelu_gate %s split %d stack %s" % (t, s, stack), gelu, {"x_ptr": "*" + t, "out_ptr": out,
                 "inter": "i32"}, {"BLOCK": 1024, "SPLIT": s, "STACK": stack})
    for res, parts in ((False, 1), (True, 1)) + (((True, 2),) if t == "fp32" else ()):   # 2: o as two products
        compile_("add_layer_norm %s split %d residual %s parts %d" % (t, s, res, parts), norm,
                 {"x_ptr": "*fp32", "o_ptr": "*" + t, "ob_ptr": "*" + t, "w_ptr": "*" + t, "b_ptr": "*" + t,
                  "y_ptr": out, "n_rows": "i32", "d": "i32", "eps": "fp32"},
                 {"ROWS": 1, "BLOCK": 1024, "HAS_RES": res, "HAS_OB": False, "NORM": True, "HAS_B": False, "SPLIT": s,
                  "PARTS": parts})
    compile_("bias_relu %s split %d" % (t, s), relu, {"x_ptr": "*" + t, "b_ptr": "*" + t, "out_ptr": out,
             "n_rows": "i32", "k": "i32"}, {"BLOCK": 1024, "SPLIT": s})
    if s:
        compile_("split_fp16 terms %d" % s, split, {"x_ptr": "*fp32", "out_ptr": "*fp16", "n_rows": "i32", "k": "i32"},
                 {"BLOCK": 1024, "TERMS": s})
    # packed float32 attention with a split output (the exact mode) at each block its plan serves
    blocks = ({(m, n) for _, m, n in ca.EXACT_BLOCKS} | {ca.EXACT_LARGE_BLOCKS} if (t, s) == ("fp32", 2)
              else {(ca.BLOCK_M, ca.BLOCK_N)})
    for varlen, (bm, bn) in [(False, (ca.BLOCK_M, ca.BLOCK_N))] + [(True, b) for b in sorted(blocks)]:
        for stack in ((False, True) if s == 2 else (False,)):
            compile_("attention %s split %d varlen %s blocks %d/%d stack %s" % (t, s, varlen, bm, bn, stack), attn,
                     {"qkv_ptr": "*" + t, "cos_ptr": "*" + t, "sin_ptr": "*" + t, "len_ptr": "*i32", "start_ptr": "*i32",
                      "blk_seg_ptr": "*i32", "blk_m0_ptr": "*i32", "out_ptr": out, "L": "i32", "window": "i32",
                      "qk_scale": "fp32", "rope": "i32", "n_tokens": "i32"},
                     {"H": 16, "HD": 64, "BLOCK_D": 64, "BLOCK_M": bm, "BLOCK_N": bn, "SLIDING": True,
                      "PREC": "tf32x3" if t == "fp32" else None, "FOR_LOOP": True, "VARLEN": varlen, "SPLIT": s,
                      "STACK": stack})
print("all variants compiled")
'''


def test_kernels_compile_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")   # compile, not read a cache
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "all variants compiled" in out.stdout, out.stdout


# kernel_compile.ahead through Triton's own launch path on this CPU: a stand-in driver for an sm_90
# device whose binary loads and launches are recorded (there is no GPU); Triton's compiler is real
AHEAD_CHILD = r'''
import json, sys, threading
import torch, triton, triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime import driver
from laya_grpc.inference import kernel_compile

LAUNCHES, LOADS = [], []

class Utils:
    def load_binary(self, name, kernel, shared, device):
        LOADS.append([name, threading.current_thread().name])
        return 1, 2, 32, 0, 1024
    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}

class Launcher:
    def __init__(self, src, metadata):
        self.name = src.fn.__name__
    def __call__(self, *args):
        LAUNCHES.append(self.name)

class SM90(DriverBase):
    utils, launcher_cls = Utils(), Launcher
    @classmethod
    def is_active(cls): return True
    def map_python_to_cpp_type(self, ty): return "void*"
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")
    def get_benchmarker(self): raise NotImplementedError
    def get_current_device(self): return 0
    def get_current_stream(self, device): return 0

driver.set_active(SM90())

@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)

@triton.jit
def shift(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

@triton.jit
def broken(x_ptr, BLOCK: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + tl.arange(0, BLOCK)) @ 1)

x, y = torch.zeros(4096), torch.zeros(4096)

def step():
    for blk in (128, 256):   # two constexpr values: two variants of each kernel
        scale[(1,)](x, y, 4096, BLOCK=blk)
        shift[(1,)](x, y, 4096, BLOCK=blk)
        scale[(1,)](x, y, 4096, BLOCK=blk)

# the thread that computes Triton's library hash (lru_cache'd, looked up by every compile's cache key)
import functools, triton.runtime.cache as triton_cache
KEY_THREADS, _key = [], triton_cache.triton_key.__wrapped__

@functools.lru_cache()
def recorded_key():
    KEY_THREADS.append(threading.current_thread().name)
    return _key()

triton_cache.triton_key = recorded_key
kernel_compile.hash_library_ahead()
kernel_compile.hash_library_ahead()   # once a process: a second call starts nothing
out = {"variants": kernel_compile.ahead([step, step], -1), "launches_ahead": len(LAUNCHES), "loads": LOADS[:],
       "hook_after": knobs.runtime.jit_cache_hook is not None, "key_threads": KEY_THREADS[:]}
step()
out["launches_after"], out["loads_after"] = LAUNCHES[:], len(LOADS)
try:
    kernel_compile.ahead([lambda: broken[(1,)](x, BLOCK=64)], -1)
    out["broken"] = "no error"
except Exception as e:
    out["broken"] = type(e).__name__
out["hook_after_error"] = knobs.runtime.jit_cache_hook is not None
try:   # no stand-in is left behind: the launch compiles again, and fails again
    broken[(1,)](x, BLOCK=64)
    out["broken_again"] = "no error"
except Exception as e:
    out["broken_again"] = type(e).__name__
print(json.dumps(out))
'''


def test_ahead_compiles_each_variant_once_on_the_pool_and_launches_nothing(tmp_path):
    """kernel_compile.ahead (what TorchRunner.warm runs before its captures): the dry passes launch
    nothing; each kernel variant compiles and loads once, on the pool's threads, including two
    functions whose variants share one specialization key (Triton's key is per function); the real
    pass after it compiles and loads nothing and launches every kernel; a compile error is raised,
    and no stand-in is left behind for that kernel (its next launch compiles, and fails, again);
    Triton's hook is unset afterwards either way. Triton's hash of its own library, which every
    compile's cache key starts with, is computed once, on the thread `hash_library_ahead` started:
    `ahead` waits for it rather than hashing the library again on the launching thread."""
    import json
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton")
    script = tmp_path / "ahead_child.py"   # a file: @triton.jit reads its kernels' source
    script.write_text(AHEAD_CHILD)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["variants"] == 4 and out["launches_ahead"] == 0, out
    assert sorted(name for name, _ in out["loads"]) == ["scale", "scale", "shift", "shift"], out
    assert all(thread.startswith("kernel-compile") for _, thread in out["loads"]), out
    assert out["launches_after"] == ["scale", "shift", "scale"] * 2 and out["loads_after"] == 4, out
    assert out["broken"] != "no error" and out["broken_again"] != "no error", out
    assert not out["hook_after"] and not out["hook_after_error"], out
    assert out["key_threads"] == ["triton-library-hash"], out
