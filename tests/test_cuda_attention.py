"""The one-launch attention kernel (inference/cuda_attention.py) on CPU, through Triton's
interpreter (TRITON_INTERPRET=1), the same kernel code the H200 runs.

The kernel against the reference (RoPE through the eager ops, then SDPA with the boolean masks of
`LayaTorch._masks`), FULL and SLIDING, padded rows, rows of length 1 (and 0), windows below and
above L, L off the block size, head sizes 12..64; `encode_fused` with it against `encode` on real
tokenized rows; the parallel layout still on the rope_qk + SDPA path.
"""
from __future__ import annotations

import types

import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from laya_grpc.inference import cuda_attention as ca  # noqa: E402
from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch, _rotate_half  # noqa: E402
from laya_grpc.core.checkpoints.model_shape import FULL, SLIDING  # noqa: E402
from test_fused_encoder import _batch  # noqa: E402  (tests/ is on sys.path under pytest)


def _reference(qkv, cos, sin, lengths, B, L, H, window, sliding, scale):
    """RoPE as transformers applies it (fp32, rounded to the storage dtype), then SDPA in fp32 with the
    masks `LayaTorch._masks` builds for these prefix-contiguous rows; [B*L, H*hd] token-major.

    A row of length 0 has no key under FULL; the kernel documents that it then attends key 0 (its
    output stays finite), so the reference does the same for such rows."""
    hd = qkv.shape[1] // (3 * H)
    dt = qkv.dtype
    attention_mask = (torch.arange(L)[None, :] < lengths[:, None].long()).long()
    model = types.SimpleNamespace(spec=types.SimpleNamespace(sliding_window=window))
    mask = LayaTorch._masks(model, attention_mask, None, None, L)[SLIDING if sliding else FULL]
    mask = mask.expand(B, 1, L, L).clone()
    if not sliding:
        mask[lengths == 0, :, :, 0] = True
    q, k, v = qkv.view(B, L, 3, H, hd).transpose(1, 3).unbind(dim=2)           # [B, H, L, hd]
    c, s = cos[:L].float(), sin[:L].float()
    qf, kf = q.float(), k.float()
    q = (qf * c + _rotate_half(qf) * s).to(dt)
    k = (kf * c + _rotate_half(kf) * s).to(dt)
    a = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=scale)
    return a.transpose(1, 2).reshape(B * L, H * hd)


def _inputs(B, L, H, hd, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(B * L, 3 * H * hd, generator=g).to(dtype)
    cos, sin = (torch.randn(L + 7, hd, generator=g).to(dtype) for _ in range(2))   # tables longer than L
    return qkv, cos, sin


CASES = [
    # B, L, H, hd, window, lengths, dtype, block_m
    (2, 70, 2, 16, 8, (70, 33), torch.float32, None),         # L off the block, window < L, a padded row
    (4, 37, 2, 32, 100, (37, 1, 20, 0), torch.float32, 64),   # window > L, rows of length 1 and 0
    (3, 40, 3, 12, 5, (40, 1, 17), torch.float32, 32),        # hd not a power of two (BLOCK_D masking)
    (1, 150, 1, 64, 64, (131,), torch.float32, 32),           # the real head size and window, 3 key blocks
    (2, 130, 2, 16, 16, (130, 5), torch.float16, 64),
]
# no bf16 case here: Triton 3.6's interpreter computes tl.dot on bf16 operands wrongly (it reads their
# bits as another type); benchmarks/attention_check.py checks bf16 on the GPU
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "sliding"])
@pytest.mark.parametrize("B,L,H,hd,window,lengths,dtype,block_m", CASES)
def test_attention_kernel_equals_reference(B, L, H, hd, window, lengths, dtype, block_m, sliding):
    qkv, cos, sin = _inputs(B, L, H, hd, dtype, seed=B * L + hd)
    lens = torch.tensor(lengths, dtype=torch.int32)
    scale = hd ** -0.5
    out = torch.full((B * L, H * hd), float("nan"), dtype=dtype)     # poisoned: every element must be written
    kw = {} if block_m is None else {"block_m": block_m}            # None: the default block
    got = ca.attention(qkv, cos, sin, lens, B, L, H, window, sliding, scale, out=out, **kw)
    assert got is out and got.shape == (B * L, H * hd) and got.dtype == dtype
    assert torch.isfinite(got).all()
    ref = _reference(qkv, cos, sin, lens, B, L, H, window, sliding, scale)
    # every query row, padded ones included: for them the reference masks define the same sets
    # (FULL: the row's real keys; SLIDING: real keys in the window, plus the query itself)
    torch.testing.assert_close(got.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_attention_never_reads_keys_past_the_row():
    """FULL: key blocks wholly beyond a row's length are skipped, so NaN keys and values there cannot
    leak (a visited block would give 0 * NaN = NaN in p @ v)."""
    B, L, H, hd = 2, 200, 2, 16
    qkv, cos, sin = _inputs(B, L, H, hd, torch.float32, seed=5)
    lens = torch.tensor([10, 64], dtype=torch.int32)
    ref = _reference(qkv, cos, sin, lens, B, L, H, 8, False, hd ** -0.5)
    poisoned = qkv.clone().view(B, L, 3, H * hd)
    poisoned[:, 64:, 1:] = float("nan")     # k and v of every token past the first key block
    got = ca.attention(poisoned.view(B * L, -1), cos, sin, lens, B, L, H, 8, False, hd ** -0.5, block_m=64)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_integer_arguments_are_not_specialised():
    """Every CUDA-graph bucket must reuse one compiled variant: the varying integers are excluded from
    Triton's specialisation, by names that really are the kernels' arguments (a misspelt name is
    silently ignored by Triton)."""
    def unspecialised(kernel):
        names = getattr(kernel, "do_not_specialize", None)
        if names is None:                                   # the interpreter keeps the jit kwargs
            names = kernel.kwargs.get("do_not_specialize")
        args = getattr(kernel, "arg_names", None)
        assert set(names) <= set(args), (names, args)
        return set(names)
    _, attention_kernel = ca._kernel()
    _, rope_kernel, _ = ck._kernels()
    assert unspecialised(attention_kernel) == {"L", "window", "rope", "n_tokens"}
    assert unspecialised(rope_kernel) == {"n_tokens", "L"}


def _with_padded_row(b: dict) -> dict:
    """One extra row as cuda_graphs.fill_bucket pads: one attended token, no markers."""
    out = {}
    for k, v in b.items():
        extra = torch.zeros_like(v[:1])
        if k == "attention_mask":
            extra[0, 0] = 1
        out[k] = torch.cat([v, extra])
    return out


def _spy(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def wrapper(*a, **kw):
        calls.append(name)
        return real(*a, **kw)
    monkeypatch.setattr(module, name, wrapper)
    return calls


@pytest.mark.parametrize("preset", ["tiny", "tiny-ml", "tiny-par"])
def test_encode_fused_equals_reference(preset, tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt, monkeypatch):
    """Hidden states of every position (padded ones and a cuda_graphs-style extra row included):
    `encode_fused` against `encode` (the upstream-exact reference), fp32. The whole forward's logits
    through encode_fused are tests/test_fused_encoder.py's."""
    path = {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt}[preset]
    b = _with_padded_row(_batch(path))
    parallel = "option_ids" in b
    assert parallel == (preset == "tiny-par")
    model = LayaTorch.from_checkpoint(path)
    args = (b["input_ids"], b["attention_mask"], b.get("position_ids"), b.get("option_ids"))
    with torch.inference_mode():
        ref = model.encode(*args)
        model.use_fused_kernels()
        attn_calls = _spy(monkeypatch, ca, "attention")
        rope_calls = _spy(monkeypatch, ck, "rope_qk")
        got = model.encode_fused(*args)
    n_layers = model.spec.num_layers
    assert set(model.spec.layer_types) == {FULL, SLIDING}   # both kinds of layer ran
    # the sequential layout is one kernel a layer; the parallel layout keeps rope_qk + SDPA
    one_kernel = not parallel
    assert (len(attn_calls), len(rope_calls)) == ((n_layers, 0) if one_kernel else (0, n_layers))
    # a row long enough that some sliding query block skips a whole key block (the band logic runs)
    assert int(b["attention_mask"].sum(1).max()) > ca.BLOCK_N + model.spec.sliding_window + 32
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert float(ref.std()) > 0.1            # a real spread, not a degenerate output


