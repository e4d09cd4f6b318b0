"""Triton kernels that collapse the encoder's elementwise chains on CUDA.

Why: behind CUDA graphs a short request is launch-bound (~30 kernels a layer x 28 layers, ~3 ms
on an H200 against a ~0.2 ms memory floor). RoPE alone is ~14 of those kernels (fp32 casts,
rotate_half's chunk/neg/cat, four multiplies and adds, two casts back), the GELU gate 2 more.
Here each is one pass:

- `rope_qk`: q and k of one token, rotated in fp32 from the fused Wqkv output and the model's
  cached 16-bit cos/sin tables (transformers' apply_rotary_pos_emb), one program per token;
- `gelu_gate`: ModernBERT's GLU, gelu(first half) * second half, rounded after the GELU as the
  eager fp16 ops round, so the CUDA results equal the reference kernels' to float rounding;
- `add_layer_norm`: the residual add and the LayerNorm after it (x += o in place, y = LN(x)), one
  pass instead of a residual-in-the-GEMM `addmm` (cuBLAS copies x into its output first, a DtoD
  memcpy per GEMM) plus a LayerNorm launch. It also rounds as `encode` does: the GEMM output to the
  dtype, then the add, where addmm rounded once. `layer_norm` is the same kernel with no `o`. The
  residual x may be float32 while o and y are 16-bit: the residual stream then never rounds to 16
  bits (what keeps the served answers close to CPU fp32, docs/precision.md);
- the decision head's steps between its GEMMs (torch_model._fused_head): `add_layer_norm` with the
  GEMM's bias and the norm's bias (`o_bias=`, `bias=`), `add_bias` (the last residual add, no norm)
  and `bias_relu`: with its GEMMs and attention, 9 launches a head layer where the exact mode's eager
  ops took 17;
- `split_fp16`: a float32 activation as a pair of fp16 halves (hi, lo) for the tensor-core GEMMs of
  split_gemm.py, which keep float32 accuracy at fp16 speed. `add_layer_norm`, `gelu_gate`,
  `bias_relu` and cuda_attention.py's kernel write that form themselves (`split=`, `split_store`)
  when their output feeds such a GEMM: one launch fewer each.

Triton imports lazily: on a host without it `available()` says why, and the CPU tests run these
same kernels through Triton's interpreter (TRITON_INTERPRET=1, tests/test_fused_encoder.py).
"""
from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def split_store():
    """`_store_split(ptr, v, k, mask, TERMS)`: float32 values v at ptr as fp16 parts k elements apart,
    [hi | lo] (TERMS 2) or [hi | lo | hi] (TERMS 3), hi = fp16(v), lo = fp16(v - hi): the layout
    split_gemm.SplitLinear multiplies. The kernels whose output feeds a split GEMM write it so
    (`split=`): one launch and one float32 round trip through memory fewer per GEMM. In Triton's
    interpreter hi and lo are exactly what `split_fp16` makes of the kernel's float32 output. Compiled
    for a GPU, the split variant is another compile of the same code: its v may lie a few float32
    ulps from the plain variant's (a row's sums in another order: the norm's mean and variance, on an
    H100), and the last product may be contracted into lo's subtraction (an FMA, lo = v_exact - hi).
    hi may then round to the neighbour of the plain output's hi, and lo makes up for it: hi + lo stays
    within 2^-20 |v| + 2^-24 of the plain output (benchmarks/cuda_check.py checks it on the GPU)."""
    import triton
    import triton.language

    # module globals: kernels here and in cuda_attention.py call the helper, compiled or interpreted, and
    # Triton's interpreter looks triton.language up in the helper's module globals
    global _store_split, tl
    tl = triton.language

    @triton.jit
    def _store_split(ptr, v, k, mask, TERMS: tl.constexpr):
        hi = v.to(tl.float16)
        lo = (v - hi.to(tl.float32)).to(tl.float16)       # the remainder (see above), rounded to fp16
        tl.store(ptr, hi, mask=mask)
        tl.store(ptr + k, lo, mask=mask)
        if TERMS == 3:
            tl.store(ptr + 2 * k, hi, mask=mask)

    return _store_split


@functools.lru_cache(maxsize=1)
def _kernels():
    import triton
    import triton.language as tl
    split_store()

    # n_tokens (B*L) and L change with every CUDA-graph bucket: not specialised, so Triton compiles
    # one variant for all of them rather than one per divisibility class (and again for L == 1).
    # gelu_gate's `inter` is the model's intermediate size, one value per model: it stays
    # specialised (its divisibility by 16 lets the row loads vectorise).
    @triton.jit(do_not_specialize=["n_tokens", "L"])
    def rope_qk_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr, n_tokens, L,
                       H: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                       HAS_POS: tl.constexpr):
        t = tl.program_id(0)
        if HAS_POS:
            p = tl.load(pos_ptr + t)
        else:
            p = t % L
        HD: tl.constexpr = 2 * HALF
        h = tl.arange(0, BLOCK_H)[:, None]
        j = tl.arange(0, BLOCK_HALF)[None, :]
        jm = j < HALF
        m = (h < H) & jm
        row = p.to(tl.int64) * HD
        cos1 = tl.load(cos_ptr + row + j, mask=jm).to(tl.float32)
        cos2 = tl.load(cos_ptr + row + HALF + j, mask=jm).to(tl.float32)
        sin1 = tl.load(sin_ptr + row + j, mask=jm).to(tl.float32)
        sin2 = tl.load(sin_ptr + row + HALF + j, mask=jm).to(tl.float32)
        src = qkv_ptr + t.to(tl.int64) * (3 * H * HD) + h * HD
        dst = out_ptr + t.to(tl.int64) * (H * HD) + h * HD
        for which in tl.static_range(2):            # q, then k
            x1 = tl.load(src + which * (H * HD) + j, mask=m).to(tl.float32)
            x2 = tl.load(src + which * (H * HD) + HALF + j, mask=m).to(tl.float32)
            # x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
            o1 = x1 * cos1 - x2 * sin1
            o2 = x2 * cos2 + x1 * sin2
            plane = dst + which * n_tokens * (H * HD)
            tl.store(plane + j, o1.to(out_ptr.dtype.element_ty), mask=m)
            tl.store(plane + HALF + j, o2.to(out_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def gelu_gate_kernel(x_ptr, out_ptr, inter, BLOCK: tl.constexpr, SPLIT: tl.constexpr, STACK: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < inter
        u = tl.load(x_ptr + r * 2 * inter + c, mask=m, other=0.0).to(tl.float32)
        g = tl.load(x_ptr + r * 2 * inter + inter + c, mask=m, other=0.0).to(tl.float32)
        gelu = 0.5 * u * (1.0 + tl.math.erf(u * 0.7071067811865476))
        if SPLIT == 0:
            # the eager ops round F.gelu's result to the tensor dtype before the multiply
            gelu = gelu.to(out_ptr.dtype.element_ty).to(tl.float32)
            tl.store(out_ptr + r * inter + c, (gelu * g).to(out_ptr.dtype.element_ty), mask=m)
        elif STACK:   # the parts stacked as row blocks, [SPLIT * N, I] (split_gemm.SplitLinear.on_stacked)
            _store_split(out_ptr + r * inter + c, gelu * g, tl.num_programs(0).to(tl.int64) * inter, m, SPLIT)
        else:   # a float32 result (nothing to round), written as the split GEMM's fp16 parts
            _store_split(out_ptr + r * (SPLIT * inter) + c, gelu * g, inter, m, SPLIT)

    return triton, rope_qk_kernel, gelu_gate_kernel


@functools.lru_cache(maxsize=1)
def _norm_kernel():
    """Built apart from `_kernels()`, whose (triton, rope, gelu) triple callers unpack."""
    import triton
    import triton.language as tl
    split_store()

    # ROWS rows of the [N, d] residual stream per program, each whole row in registers (BLOCK =
    # next_power_of_2(d), masked past d): one row at the real d = 1024, several at small widths so a
    # program still has ~1024 elements. n_rows (N = B*L) changes with every CUDA-graph bucket: not
    # specialised, so every bucket reuses one compiled variant per (dtype, d, HAS_RES); d (one value
    # per model) stays specialised, its divisibility by 16 vectorises the row loads.
    @triton.jit(do_not_specialize=["n_rows"])
    def add_layer_norm_kernel(x_ptr, o_ptr, ob_ptr, w_ptr, b_ptr, y_ptr, n_rows, d, eps,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr, HAS_OB: tl.constexpr,
                              NORM: tl.constexpr, HAS_B: tl.constexpr, SPLIT: tl.constexpr, PARTS: tl.constexpr):
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        c = tl.arange(0, BLOCK)[None, :]
        cm = c < d
        m = (r < n_rows) & cm
        off = r.to(tl.int64) * d + c
        h = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            o = tl.load(o_ptr + off, mask=m, other=0.0).to(tl.float32)
            if PARTS == 2:   # o as [2, N, d]: the products of the GEMM input's two fp16 halves, summed here
                o += tl.load(o_ptr + n_rows.to(tl.int64) * d + off, mask=m, other=0.0).to(tl.float32)
            if HAS_OB:   # the GEMM's bias, added to its float32 output before the residual add
                o += tl.load(ob_ptr + c, mask=cm, other=0.0).to(tl.float32)
            h += o
            # the eager `x + o` rounds the sum to the stream's dtype; the statistics use that value
            h = h.to(x_ptr.dtype.element_ty)
            tl.store(x_ptr + off, h, mask=m)
            h = h.to(tl.float32)
        if NORM:
            mean = tl.sum(h, axis=1)[:, None] / d
            diff = tl.where(cm, h - mean, 0.0)
            var = tl.sum(diff * diff, axis=1)[:, None] / d        # biased, as F.layer_norm
            rstd = tl.math.rsqrt(var + eps)
            w = tl.load(w_ptr + c, mask=cm, other=0.0).to(tl.float32)
            # torch's CUDA kernel: gamma * (rstd * (x - mean)) (+ beta), in fp32, one rounding to the dtype
            v = w * (diff * rstd)
            if HAS_B:
                v += tl.load(b_ptr + c, mask=cm, other=0.0).to(tl.float32)
            if SPLIT == 0:
                tl.store(y_ptr + off, v.to(y_ptr.dtype.element_ty), mask=m)
            else:   # a float32 y, written as the split GEMM's fp16 parts
                _store_split(y_ptr + r.to(tl.int64) * (SPLIT * d) + c, v, d, m, SPLIT)

    return triton, add_layer_norm_kernel


def available() -> tuple[bool, str]:
    """(usable, why not): Triton importable and able to build these kernels here."""
    try:
        _kernels()
        _norm_kernel()
        _relu_kernel()
        _split_kernel()
    except Exception as e:  # noqa: BLE001 - reported to the operator, never swallowed
        return False, "triton unavailable: %s: %s" % (type(e).__name__, e)
    return True, ""


def rope_qk(qkv, cos, sin, position_ids, B: int, L: int, heads: int):
    """Rotated q and k, [2, B*L, H, hd] in qkv's dtype, from qkv [B*L, 3*H*hd] (contiguous).

    cos/sin: [>= max position + 1, hd] tables; position_ids: [B, L] int64 (parallel option
    layout) or None (position = index within the row)."""
    import torch
    triton, kernel, _ = _kernels()
    n, width = qkv.shape
    hd = width // (3 * heads)
    out = torch.empty((2, n, heads, hd), dtype=qkv.dtype, device=qkv.device)
    pos = position_ids.reshape(-1) if position_ids is not None else qkv   # unused when HAS_POS is False
    kernel[(n,)](qkv, cos, sin, pos, out, n, L, H=heads, HALF=hd // 2,
                 BLOCK_H=triton.next_power_of_2(heads), BLOCK_HALF=triton.next_power_of_2(hd // 2),
                 HAS_POS=position_ids is not None)
    return out


def split_out(n: int, k: int, dtype, split: int, device, what: str, stack: bool = False):
    """The output buffer: [n, k] of `dtype`, or with `split` (2 or 3 terms, float32 results only)
    [n, split * k] fp16 in split_fp16's layout; with `stack` as well (2 terms) [2 * n, k], the halves
    stacked as row blocks (split_gemm.SplitLinear.on_stacked)."""
    import torch
    if not split:
        return torch.empty((n, k), dtype=dtype, device=device)
    if split not in (2, 3) or dtype != torch.float32 or (stack and split != 2):
        raise ValueError("%s: split output needs a float32 result and 2 or 3 terms (2 stacked); got %s, %r, stack %s"
                         % (what, dtype, split, stack))
    return torch.empty((2 * n, k) if stack else (n, split * k), dtype=torch.float16, device=device)


def gelu_gate(x, split: int = 0, stack: bool = False):
    """gelu(x[:, :I]) * x[:, I:] for x [N, 2I] (contiguous) -> [N, I]; with `split` (float32 x) the
    fp16 parts split_fp16(result, split) would make, [N, split * I]; with `stack` too (2 terms) the
    same parts as row blocks, [hi; lo] [2N, I]."""
    triton, _, kernel = _kernels()
    n, two_i = x.shape
    inter = two_i // 2
    out = split_out(n, inter, x.dtype, split, x.device, "gelu_gate", stack)
    block = min(1024, triton.next_power_of_2(inter))
    kernel[(n, triton.cdiv(inter, block))](x, out, inter, BLOCK=block, SPLIT=split, STACK=bool(stack))
    return out


def _norm_launch(x, o, weight, eps: float, out_dtype=None, split: int = 0, bias=None, o_bias=None, norm: bool = True):
    triton, kernel = _norm_kernel()
    n, d = x.shape
    vectors = [v for v in (weight, bias, o_bias) if v is not None]
    parts = 2 if o is not None and o.dim() == 3 else 1
    if not x.is_contiguous() or any(v.shape != (d,) for v in vectors) or (o is None and o_bias is not None) \
            or (o is not None and (tuple(o.shape) not in ((n, d), (2, n, d)) or not o.is_contiguous())):
        raise ValueError("add_layer_norm: x contiguous [N, d], o contiguous [N, d] or [2, N, d], weight, bias, "
                         "o_bias [d]; got %s %s %s"
                         % (tuple(x.shape), None if o is None else (tuple(o.shape), o.dtype),
                            [tuple(v.shape) for v in vectors]))
    y = split_out(n, d, out_dtype or x.dtype, split, x.device, "add_layer_norm") if norm else None
    block = triton.next_power_of_2(d)
    rows = max(1, 1024 // block)
    # ~1024 elements a program, 4 warps: 8 per thread, 16-byte loads at fp16 (d = 1024: one row)
    kernel[(triton.cdiv(n, rows),)](x, x if o is None else o, x if o_bias is None else o_bias,
                                    x if weight is None else weight, x if bias is None else bias,
                                    x if y is None else y, n, d, float(eps), ROWS=rows, BLOCK=block,
                                    HAS_RES=o is not None, HAS_OB=o_bias is not None, NORM=norm,
                                    HAS_B=bias is not None, SPLIT=split, PARTS=parts,
                                    num_warps=min(max(rows * block // 256, 1), 16))
    return y


def add_layer_norm(x, o, weight, eps: float, out_dtype=None, split: int = 0, bias=None, o_bias=None):
    """(x, y): x += o (+ o_bias) in place (rounded to x's dtype, as the eager `x + o`), y =
    layer_norm(x, (d,), weight, bias, eps) in a new buffer of `out_dtype` (default x's). x, o: [N, d]
    contiguous (o may be [2, N, d], two float32 parts added first: split_gemm.SplitLinear.on_stacked),
    each of any float dtype (the residual stream x is float32 on CUDA, o a 16-bit or
    float32 GEMM output); weight, bias, o_bias (o's GEMM bias, added in float32): [d]; fp32 maths.
    With `split` (a float32 y) y comes as split_fp16(y, split) would make it."""
    return x, _norm_launch(x, o, weight, eps, out_dtype, split, bias, o_bias)


def add_bias(x, o, o_bias):
    """x += o + o_bias in place (rounded once to x's dtype): a residual add with no norm after it
    (the decision head's last layer), `add_layer_norm`'s kernel without its norm."""
    _norm_launch(x, o, None, 0.0, o_bias=o_bias, norm=False)
    return x


def layer_norm(x, weight, eps: float, out_dtype=None):
    """layer_norm(x, (d,), weight, None, eps) for x [N, d] contiguous, into `out_dtype` (default x's):
    `add_layer_norm` with no o (x is only read)."""
    return _norm_launch(x, None, weight, eps, out_dtype)


@functools.lru_cache(maxsize=1)
def _relu_kernel():
    import triton
    import triton.language as tl
    split_store()

    # n_rows changes with every CUDA-graph bucket: not specialised (one compiled variant per width)
    @triton.jit(do_not_specialize=["n_rows"])
    def bias_relu_kernel(x_ptr, b_ptr, out_ptr, n_rows, k, BLOCK: tl.constexpr, SPLIT: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < k
        v = tl.load(x_ptr + r * k + c, mask=m, other=0.0).to(tl.float32) + tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
        v = tl.maximum(v, 0.0)
        if SPLIT == 0:
            tl.store(out_ptr + r * k + c, v.to(out_ptr.dtype.element_ty), mask=m)
        else:   # written as the split GEMM's fp16 parts
            _store_split(out_ptr + r * (SPLIT * k) + c, v, k, m, SPLIT)

    return triton, bias_relu_kernel


def bias_relu(x, bias, out_dtype, split: int = 0):
    """relu(x + bias) for a GEMM's float32 output x [N, K] (contiguous) and its bias [K], in fp32 and
    rounded once to `out_dtype`; with `split` (a float32 result) as split_fp16 would make it [N, split*K].
    The decision head's linear1: bias and ReLU in the pass that also splits linear2's input."""
    triton, kernel = _relu_kernel()
    n, k = x.shape
    if not x.is_contiguous() or bias.shape != (k,):
        raise ValueError("bias_relu: contiguous [N, K] input and a [K] bias; got %s, %s"
                         % (tuple(x.shape), tuple(bias.shape)))
    out = split_out(n, k, out_dtype, split, x.device, "bias_relu")
    block = min(1024, triton.next_power_of_2(k))
    kernel[(n, triton.cdiv(k, block))](x, bias, out, n, k, BLOCK=block, SPLIT=split)
    return out


@functools.lru_cache(maxsize=1)
def _split_kernel():
    import triton
    import triton.language as tl
    split_store()

    # n_rows changes with every CUDA-graph bucket: not specialised (one compiled variant per width)
    @triton.jit(do_not_specialize=["n_rows"])
    def split_kernel(x_ptr, out_ptr, n_rows, k, BLOCK: tl.constexpr, TERMS: tl.constexpr):
        r = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = c < k
        x = tl.load(x_ptr + r * k + c, mask=m, other=0.0).to(tl.float32)
        _store_split(out_ptr + r * (TERMS * k) + c, x, k, m, TERMS)

    return triton, split_kernel


def split_fp16(x, terms: int):
    """x [N, K] float32 (contiguous) -> [N, terms*K] float16: [hi | lo] (terms 2) or [hi | lo | hi]
    (terms 3), hi = fp16(x), lo = fp16(x - hi), so hi + lo carries ~22 bits of x's 24 (split_gemm.py)."""
    import torch
    triton, kernel = _split_kernel()
    n, k = x.shape
    if terms not in (2, 3) or not x.is_contiguous():
        raise ValueError("split_fp16: contiguous [N, K] input and 2 or 3 terms; got %s, %r" % (tuple(x.shape), terms))
    out = torch.empty((n, terms * k), dtype=torch.float16, device=x.device)
    block = min(1024, triton.next_power_of_2(k))
    kernel[(n, triton.cdiv(k, block))](x, out, n, k, BLOCK=block, TERMS=terms)
    return out
