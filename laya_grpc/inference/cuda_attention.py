"""One Triton kernel for a whole encoder attention layer (sequential option layout), for CUDA graphs.

Why: at one short row the fused encoder is launch- and layout-bound, and per layer its attention
part was four steps (`rope_qk` writing a [2, N, H, hd] buffer, SDPA reading an additive fp16 bias
of [B, 1, L, L] or [L, L], then `a.transpose(1, 2).reshape(N, d)`, a copy, into the Wo GEMM).
Here it is one launch that:

- reads q, k and v straight from the fused Wqkv output `qkv` [N = B*L, 3*H*hd] (row-major: q, k,
  then v, each H heads of hd);
- rotates q and k on load exactly as `cuda_kernels.rope_qk` does (fp32 maths from the model's
  16-bit cos/sin tables, position = index within the row, the rotated values rounded to the storage
  dtype before the dot products, as transformers' apply_rotary_pos_emb + `.to(dtype)` round them);
- computes softmax(q k^T * scale + mask) v with an online (flash-style) softmax in fp32, tl.dot with
  fp32 accumulation (fp32 storage: 3xTF32, `dot_precision`), the probabilities rounded to the
  storage dtype before the p @ v product (as flash kernels do);
- builds the masks in the kernel from per-row lengths (`attention_mask.sum(1)`, int32 on the device,
  computed once per forward: no host sync) and the layer type, the same sets as
  `LayaTorch._masks` for the sequential layout:
      FULL:    key j attended iff j < len(b)
      SLIDING: (j < len(b) and |i - j| <= window) or i == j
  and visits only the key blocks that hold an attended key (a sliding layer only its band, a
  full layer only the real tokens), so padding costs nothing as a key;
- writes the result token-major, [N, H*hd] row-major, ready for the Wo addmm (no transpose copy).

Assumptions (what `cuda_graphs.fill_bucket` and `PackedRows.pad` produce): every row is
prefix-contiguous (real tokens first, then padding), so `attention_mask[b]` is `j < len(b)`. A row
of length 0 never reaches a FULL layer there (extra rows get one attended token); should one come
anyway, the kernel lets its queries attend key 0 so the output stays finite (SDPA would give NaN).

Grid: (cdiv(L, BLOCK_M), B*H), one program per block of BLOCK_M = 64 query rows of one (row, head),
keys in blocks of BLOCK_N = 64, 4 warps, 3 pipeline stages when the grid fits in one wave of
multiprocessors, else 2 (`_num_stages`). L and window are `do_not_specialize`: Triton would
otherwise compile a variant per divisibility class (and L == 1) of these integers, and every
CUDA-graph bucket (tokens 16..512 x rows 1..256) must reuse the kernels compiled for the first one.
B and N are not arguments at all (the row index comes from the grid). What still selects a compiled
variant: dtype, H, hd, FULL/SLIDING and the stage count, so four variants per model
(benchmarks/attention_check.py counts what a sweep over all 90 bucket shapes x both layer types
compiles).

Packed rows (`attention_packed`, VARLEN): the same kernel over several rows laid end to end in one
token stream (inference/packing.py). A block table gives each program its (segment, first query);
a segment's tokens are `len` from `start`, its positions count from its own start, and its keys are
its own tokens only, so the masks above hold per segment and no padding exists between rows. `rope`
0 (the decision head's layers) skips the rotation: a runtime flag, not a constexpr, so the head's
FULL layers reuse the encoder's compiled FULL variant (one Triton compile less at a cold start). Spare table entries point at an empty
segment and end at once. Each packed bucket's table has its own queries an entry, and its launches
take that BLOCK_M and their keys a step: with float32 attention 16 queries and 32 queries at 64 keys in
small and mid-size buckets, 64 queries at 32 keys beyond (EXACT_BLOCKS, below), else 64 and 64, so the
exact mode compiles six variants where the fast mode compiles two.

Triton imports lazily (as cuda_kernels.py); the CPU tests run this same kernel through Triton's
interpreter (TRITON_INTERPRET=1, tests/test_cuda_attention.py).
"""
from __future__ import annotations

import functools

from . import cuda_kernels as ck

BLOCK_N = 64            # keys per step: one 64-key block is a 64x64 fp16 tile on the tensor cores
_LOG2E = 1.4426950408889634


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def _key_block(qkv_ptr, cos_ptr, sin_ptr, q, acc, m_i, l_i, n0, row0, h, offs_m, offs_d, d_ok, rot_d, sign,
                   L, n_keys, window, qk_scale, H: tl.constexpr, HD: tl.constexpr, BLOCK_N: tl.constexpr,
                   SLIDING: tl.constexpr, PREC: tl.constexpr, rope):
        """One BLOCK_N block of keys: rotate k, scores, mask, online-softmax update of (acc, m, l)."""
        STRIDE: tl.constexpr = 3 * H * HD
        dt = qkv_ptr.dtype.element_ty
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < L
        km = n_ok[:, None] & d_ok[None, :]
        k_base = qkv_ptr + (row0 + offs_n)[:, None] * STRIDE + H * HD + h * HD
        if rope != 0:
            kx = tl.load(k_base + offs_d[None, :], mask=km, other=0.0).to(tl.float32)
            kxr = tl.load(k_base + rot_d[None, :], mask=km, other=0.0).to(tl.float32)
            tk = offs_n[:, None] * HD
            kc = tl.load(cos_ptr + tk + offs_d[None, :], mask=km, other=0.0).to(tl.float32)
            ks = tl.load(sin_ptr + tk + offs_d[None, :], mask=km, other=0.0).to(tl.float32)
            k = (kx * kc + (sign[None, :] * kxr) * ks).to(dt)
        else:
            k = tl.load(k_base + offs_d[None, :], mask=km, other=0.0)
        # other=0: a masked key's weight is exactly 0, and 0 * (uninitialised memory) could be NaN
        v = tl.load(k_base + H * HD + offs_d[None, :], mask=km, other=0.0)

        sc = tl.dot(q, tl.trans(k), input_precision=PREC)
        sc = sc * qk_scale                           # log2 domain: softmax via exp2
        ok = (offs_n < n_keys)[None, :]
        if SLIDING:
            diff = offs_m[:, None] - offs_n[None, :]
            ok = (ok & (diff <= window) & (diff >= -window)) | ((diff == 0) & n_ok[None, :])
        sc = tl.where(ok, sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        pv = tl.dot(p.to(dt), v, input_precision=PREC)
        acc = acc * alpha[:, None] + pv
        return acc, m_new, l_i

    # the kernel finds its helper as a module global: Triton's interpreter (and its compiler's
    # dependency scan) resolve a jit function's callees through its __globals__, not its closure
    globals()["_key_block"] = _key_block
    _store_split = ck.split_store()   # the output in a split GEMM's form (cuda_kernels.py)
    globals()["_store_split"] = _store_split

    @triton.jit(do_not_specialize=["L", "window", "rope", "n_tokens"])
    def attention_kernel(qkv_ptr, cos_ptr, sin_ptr, len_ptr, start_ptr, blk_seg_ptr, blk_m0_ptr, out_ptr,
                         L, window, qk_scale, rope, n_tokens,
                         H: tl.constexpr, HD: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         SLIDING: tl.constexpr, PREC: tl.constexpr, FOR_LOOP: tl.constexpr,
                         VARLEN: tl.constexpr, SPLIT: tl.constexpr, STACK: tl.constexpr):
        HALF: tl.constexpr = HD // 2
        STRIDE: tl.constexpr = 3 * H * HD           # one token's row of qkv
        dt = qkv_ptr.dtype.element_ty
        if VARLEN:
            # packed rows: program (i, h) takes query block i of the block table, a (segment, first
            # query) pair; a segment is `len` tokens from `start` in the flat token stream
            pid_m = tl.program_id(0)
            h = tl.program_id(1)
            b = tl.load(blk_seg_ptr + pid_m)
            m0 = tl.load(blk_m0_ptr + pid_m)
            n_len = tl.load(len_ptr + b)
            row0 = tl.load(start_ptr + b).to(tl.int64)
            L = n_len                                 # the segment is its own row: nothing past it exists
        else:
            pid_m = tl.program_id(0)
            bh = tl.program_id(1)
            b = bh // H
            h = bh % H
            n_len = tl.load(len_ptr + b)
            m0 = pid_m * BLOCK_M
            row0 = b.to(tl.int64) * L                # token index of this row's position 0
        offs_m = m0 + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HD
        # rotate_half(x) = cat(-x2, x1): column d reads its partner (d + HD/2) mod HD, negated in the first half
        rot_d = (offs_d + HALF) % HD
        sign = tl.where(offs_d < HALF, -1.0, 1.0)

        # ---- q block, rotated in fp32 and rounded to the storage dtype (as rope_qk writes it)
        m_ok = offs_m < L
        qm = m_ok[:, None] & d_ok[None, :]
        q_base = qkv_ptr + (row0 + offs_m)[:, None] * STRIDE + h * HD
        if rope != 0:
            x = tl.load(q_base + offs_d[None, :], mask=qm, other=0.0).to(tl.float32)
            xr = tl.load(q_base + rot_d[None, :], mask=qm, other=0.0).to(tl.float32)
            t_off = offs_m[:, None] * HD
            c = tl.load(cos_ptr + t_off + offs_d[None, :], mask=qm, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + t_off + offs_d[None, :], mask=qm, other=0.0).to(tl.float32)
            q = (x * c + (sign[None, :] * xr) * s).to(dt)
        else:
            q = tl.load(q_base + offs_d[None, :], mask=qm, other=0.0)

        # ---- the key range that holds every attended key of these query rows
        if SLIDING:
            # band keys need j >= i - window and j < len; the diagonal i == j lies in [m0, m0 + BLOCK_M)
            lo = tl.maximum(m0 - window, 0)
            lo += (m0 - lo) * (n_len <= m0 - window).to(tl.int32)     # no band key at all: only the diagonal
            hi = tl.maximum(tl.minimum(n_len, m0 + BLOCK_M + window), tl.minimum(m0 + BLOCK_M, L))
            lo = (lo // BLOCK_N) * BLOCK_N
            n_keys = n_len
        else:
            lo = n_len * 0                           # an int32 scalar like hi (the while form carries it)
            if VARLEN:
                n_keys = n_len                       # an empty slot (spare blocks): no key, no work, nothing stored
            else:
                n_keys = tl.maximum(n_len, 1)        # a row of length 0 attends key 0 (finite output)
            hi = n_keys

        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)   # finite: a fully masked block gives p = 0, not NaN
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        if FOR_LOOP:
            for n0 in range(lo, hi, BLOCK_N):
                acc, m_i, l_i = _key_block(qkv_ptr, cos_ptr, sin_ptr, q, acc, m_i, l_i, n0, row0, h, offs_m, offs_d,
                                           d_ok, rot_d, sign, L, n_keys, window, qk_scale,
                                           H, HD, BLOCK_N, SLIDING, PREC, rope)
        else:
            # the same loop as a while: Triton's CPU interpreter cannot take a runtime bound in range()
            # (its scalars are 1-element numpy arrays, which numpy 2 refuses as an index)
            n0 = lo
            while n0 < hi:
                acc, m_i, l_i = _key_block(qkv_ptr, cos_ptr, sin_ptr, q, acc, m_i, l_i, n0, row0, h, offs_m, offs_d,
                                           d_ok, rot_d, sign, L, n_keys, window, qk_scale,
                                           H, HD, BLOCK_N, SLIDING, PREC, rope)
                n0 += BLOCK_N

        l_i = tl.where(l_i > 0.0, l_i, 1.0)          # only rows i >= L (never stored) can have no key
        o = acc / l_i[:, None]
        if SPLIT == 0:
            out_ptrs = out_ptr + (row0 + offs_m)[:, None] * (H * HD) + h * HD + offs_d[None, :]
            tl.store(out_ptrs, o.to(out_ptr.dtype.element_ty), mask=qm)
        elif STACK:   # the same parts stacked as row blocks, [SPLIT * n_tokens, H*HD] (SplitLinear.on_stacked)
            out_ptrs = out_ptr + (row0 + offs_m)[:, None] * (H * HD) + h * HD + offs_d[None, :]
            _store_split(out_ptrs, tl.where(qm, o, 0.0), n_tokens.to(tl.int64) * (H * HD), qm, SPLIT)
        else:   # float32 attention (qkv float32), written as the Wo GEMM's fp16 parts
            out_ptrs = out_ptr + (row0 + offs_m)[:, None] * (SPLIT * H * HD) + h * HD + offs_d[None, :]
            _store_split(out_ptrs, tl.where(qm, o, 0.0), H * HD, qm, SPLIT)   # rows past L: not stored

    return triton, attention_kernel


def available() -> tuple[bool, str]:
    """(usable, why not): Triton importable and able to build this kernel here."""
    try:
        _kernel()
    except Exception as e:  # noqa: BLE001 - reported to the operator, never swallowed
        return False, "triton unavailable: %s: %s" % (type(e).__name__, e)
    return True, ""


def dot_precision(dtype):
    """tl.dot's input_precision for this storage dtype. float32 (`--dtype float32`, and the decision
    head's attention): 3xTF32 on the GPU, float32-accurate (~2^-21 relative) on the tensor cores,
    where "ieee" runs on the CUDA cores; Triton's interpreter computes in float32 whatever is asked,
    so it gets "ieee". 16-bit inputs: None, Triton's default (fp16/bf16 tensor cores, fp32 accumulation)."""
    import torch
    if dtype != torch.float32:
        return None
    return "ieee" if _interpreted() else "tf32x3"


def _interpreted() -> bool:
    import triton
    return bool(triton.knobs.runtime.interpret)


BLOCK_M = 64   # query rows a program; on the H200 (attention_check) 32 was slower or equal but at 1x160 sliding


@functools.lru_cache(maxsize=8)
def _sm_count(device) -> int:
    import torch
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def _num_stages(programs: int, device) -> int:
    """Software-pipelining depth of the key loop. H200 (attention_check, us a layer): within one wave
    of programs (a single row) 3 stages hide the load latency best (1x512 full: 11.6 against 13.4
    with 2); past it the smaller shared-memory footprint of 2 wins (64x160 full: 55 against 67)."""
    return 3 if programs <= _sm_count(device) else 2


def attention(qkv, cos, sin, lengths, B: int, L: int, heads: int, window: int, sliding: bool,
              scale: float, block_m: int = BLOCK_M, out=None, loop: str | None = None,
              num_stages: int | None = None, num_warps: int = 4, split: int = 0, stack: bool = False):
    """One layer's attention, [B*L, H*hd] token-major in qkv's dtype (with `split`, float32 qkv: the
    fp16 parts `cuda_kernels.split_fp16(result, split)` would make, [B*L, split*H*hd]).

    qkv: [B*L, 3*H*hd] contiguous (fused Wqkv output); cos/sin: [>= L, hd] contiguous rotary tables
    (position p at row p); lengths: [B] int32 on qkv's device, the real tokens of each
    prefix-contiguous row; window: |i - j| <= window for SLIDING (unused for FULL); scale: softmax
    scale (hd ** -0.5). `stack` (split 2): the two parts as row blocks, [hi; lo] [2 * B*L, H*hd], for
    split_gemm.SplitLinear.on_stacked. For measurements: `block_m` (query rows a program), `out` (the output
    buffer), `loop` (the key loop's form, "for" | "while"), num_stages / num_warps (Triton's)."""
    triton, kernel = _kernel()
    n, width = qkv.shape
    hd = width // (3 * heads)
    if n != B * L or width != 3 * heads * hd or hd % 2 or hd > 128:
        raise ValueError("attention: qkv %s does not fit B=%d L=%d heads=%d (hd even, <= 128)"
                         % (tuple(qkv.shape), B, L, heads))
    if not qkv.is_contiguous():
        raise ValueError("attention: qkv must be contiguous")
    cos, sin = cos.contiguous(), sin.contiguous()           # no-ops for the model's cached tables
    if cos.shape[0] < L or cos.shape[1] != hd:
        raise ValueError("attention: rotary table %s too short for L=%d hd=%d" % (tuple(cos.shape), L, hd))
    if out is None:
        out = ck.split_out(n, heads * hd, qkv.dtype, split, qkv.device, "attention", stack)
    grid = (triton.cdiv(L, block_m), B * heads)
    stages = num_stages or _num_stages(grid[0] * grid[1], qkv.device)
    kernel[grid](qkv, cos, sin, lengths, lengths, lengths, lengths, out, L, int(window) if sliding else 0,
                 float(scale) * _LOG2E, 1, n,
                 H=heads, HD=hd, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_M=block_m, BLOCK_N=BLOCK_N,
                 SLIDING=bool(sliding), PREC=dot_precision(qkv.dtype),
                 FOR_LOOP=(loop or ("while" if _interpreted() else "for")) == "for",
                 VARLEN=False, SPLIT=split, STACK=bool(stack), num_warps=num_warps, num_stages=stages)
    return out


# The exact mode's (float32 attention's) blocks per packed bucket size: (most tokens, BLOCK_M queries a
# program, keys a step), in order; larger buckets take EXACT_LARGE_BLOCKS. One short row in the 160-token
# bucket gives 3 blocks of 64 x 16 heads, 48 programs for 132 multiprocessors, each running the 3xTF32
# dots of its block alone: 16 queries a program took 14.4 us a layer against 24.8 with 64 (H200,
# benchmarks/exact_kernels_study.py). Up to 2,048 tokens 32 queries (4 warps) are the fastest: a layer
# of 1 x 512 tokens 44 against 62 us full and 23 against 28 sliding, 6 x 132 36 against 44 (H100,
# 2026-12-07-5c14a40), and the model 1.13x faster at 1 x 512, 1.06x at 6 x 132
# (benchmarks/query_block_plans.py). Beyond 2,048 tokens (16 rows of 132 and more) 64 queries take 32
# keys a step: a short row's 132 keys are 3 blocks of 64 holding 192 keys, or 5 of 32 holding 160; a
# layer of 64 x 132 took 263 against 304 us full, 227 against 261 sliding, and the model 3.1-3.2% less
# at 16 to 64 x 132 (H100, 2026-12-07-593581e). Below that 64 keys stay: 32 made the model 11% slower
# at 1 x 512 and 1-2% at 3 x 400 and 6 x 132, and one short row's layer 14.7 against 17.2 us.
# 16-bit attention keeps BLOCK_M and BLOCK_N everywhere (cuda_graphs.packed_plan).
EXACT_BLOCKS = ((256, 16, BLOCK_N), (2048, 32, BLOCK_N))
EXACT_LARGE_BLOCKS = (BLOCK_M, 32)


# One pipelining depth for every packed bucket: each distinct depth is one more Triton compile per
# layer kind at a cold start (~2.5 s each on the H200, serve's start-up log), and 2 is the better one
# for batches (64 x 160 full: 55 against 67 us a layer); one row of 512 pays ~1-2 us a layer for it.
PACKED_STAGES = 2


def attention_packed(qkv, cos, sin, starts, lengths, blk_seg, blk_m0, heads: int, window: int, sliding: bool,
                     scale: float, rope: bool = True, out=None, num_warps: int = 4, num_stages: int | None = None,
                     split: int = 0, block_m: int = BLOCK_M, block_n: int = BLOCK_N, stack: bool = False):
    """One layer's attention over packed rows (segments of one flat token stream), [N, H*hd].

    Each segment attends only within itself (block-diagonal), its positions counted from its own
    first token, so a packed batch computes what the same rows padded one per row compute, without
    the padding. qkv: [N, 3*H*hd] contiguous; starts/lengths: int32 per segment; blk_seg/blk_m0: int32
    block table (`packing.block_table`), one entry per BLOCK_M-query block of a segment, spare
    entries pointing at a segment of length 0. Tokens in no segment (the bucket's tail) get no
    output: their rows of `out` are left as they were. rope=False skips the rotation (the decision
    head's layers, which use no positions; cos/sin are then ignored). `split`: as `attention`'s;
    block_m: the table's queries per entry, block_n the keys a step (a bucket's `packing.PackedBucket`
    block_m and block_n). `stack` (split 2): the parts as row blocks, as `attention`'s."""
    triton, kernel = _kernel()
    n, width = qkv.shape
    hd = width // (3 * heads)
    if width != 3 * heads * hd or hd % 2 or hd > 128:
        raise ValueError("attention_packed: qkv %s does not fit heads=%d (hd even, <= 128)" % (tuple(qkv.shape), heads))
    if not qkv.is_contiguous():
        raise ValueError("attention_packed: qkv must be contiguous")
    if cos is None:
        cos = sin = qkv                       # never read (rope=False)
    if out is None:
        out = ck.split_out(n, heads * hd, qkv.dtype, split, qkv.device, "attention_packed", stack)
    grid = (blk_seg.shape[0], heads)
    stages = num_stages or PACKED_STAGES
    kernel[grid](qkv, cos, sin, lengths, starts, blk_seg, blk_m0, out, 0, int(window) if sliding else 0,
                 float(scale) * _LOG2E, int(bool(rope)), n,
                 H=heads, HD=hd, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_M=block_m, BLOCK_N=block_n,
                 SLIDING=bool(sliding), PREC=dot_precision(qkv.dtype),
                 FOR_LOOP=not _interpreted(), VARLEN=True, SPLIT=split, STACK=bool(stack),
                 num_warps=num_warps, num_stages=stages)
    return out


def lengths_of(attention_mask):
    """Per-row real-token counts as the kernel reads them: int32 on the mask's device, no host sync."""
    import torch
    return attention_mask.sum(1, dtype=torch.int32)


