"""The fused residual add + LayerNorm kernel (cuda_kernels.add_layer_norm / layer_norm) on CPU, through
Triton's interpreter (TRITON_INTERPRET=1), the same kernel code the H200 runs.

The kernel against torch's eager `x + o` and F.layer_norm (fp32, fp16; bf16 loosely, see there), the
in-place update of x, rows of one and several per program, widths off a power of two; `encode_fused`
against the eager `encode`.
"""
from __future__ import annotations


import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402

from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch  # noqa: E402
from test_cuda_attention import _spy  # noqa: E402  (tests/ is on sys.path under pytest)
from test_fused_encoder import _batch  # noqa: E402

EPS = 1e-5


def _ulp(ref: torch.Tensor) -> torch.Tensor:
    """The spacing of ref's dtype at each element's magnitude (subnormals included), as fp32."""
    fi = torch.finfo(ref.dtype)
    mant = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23}[ref.dtype]
    e = torch.floor(torch.log2(ref.float().abs().clamp_min(fi.tiny)))
    return torch.exp2(e - mant)


def _inputs(n, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, d, generator=g) * 4 + 3).to(dtype)        # an offset mean: the centring matters
    o = (torch.randn(n, d, generator=g) * 2).to(dtype)
    w = (1 + 0.3 * torch.randn(d, generator=g)).to(dtype)
    return x, o, w


SHAPES = [(1, 96), (5, 96), (33, 200), (1, 1024), (17, 1024), (40, 64)]   # one row, several rows a program, d off 2^k


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,d", SHAPES)
def test_add_layer_norm_equals_eager(n, d, dtype):
    """h = x + o bit-equal to torch's eager add in the dtype, written into x in place; y = LayerNorm(h).

    y tolerance: fp32 atol = rtol = 1e-5 (both sides compute in fp32 but reduce in different orders,
    and rsqrt vs 1/sqrt: measured <= 1e-6 on values of magnitude ~3). fp16: at most 1 fp16 ulp per
    element and <= 1% of elements off at all: the kernel's fp32 value before the one rounding to fp16
    differs from F.layer_norm's by a few fp32 ulps, which changes the fp16 result only when it sits at
    a rounding midpoint (measured: 0 to 3 elements in 65536)."""
    x, o, w = _inputs(n, d, dtype, seed=n * d)
    x0, o0 = x.clone(), o.clone()
    h = x0 + o0                                                   # the eager add, rounded to dtype
    ref = F.layer_norm(h.float(), (d,), w.float(), None, EPS).to(dtype)
    ptr = x.data_ptr()
    xx, y = ck.add_layer_norm(x, o, w, EPS)
    assert xx is x and x.data_ptr() == ptr                        # in place
    assert torch.equal(x, h)                                      # bit-equal to the eager add
    assert torch.equal(o, o0)                                     # the branch output is only read
    assert y.dtype == dtype and y.shape == (n, d) and y.data_ptr() != x.data_ptr()
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:
        err = (y.float() - ref.float()).abs()
        assert bool((err <= _ulp(ref)).all()), float((err / _ulp(ref)).max())
        assert float((y != ref).float().mean()) <= 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,d", [(1, 96), (33, 200), (17, 1024)])
def test_layer_norm_without_residual(n, d, dtype):
    """The no-`o` variant (the embedding norm): x untouched, y = F.layer_norm(x), tolerances as above."""
    x, _, w = _inputs(n, d, dtype, seed=7 * n + d)
    x0 = x.clone()
    y = ck.layer_norm(x, w, EPS)
    assert torch.equal(x, x0)
    ref = F.layer_norm(x0.float(), (d,), w.float(), None, EPS).to(dtype)
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:
        assert bool(((y.float() - ref.float()).abs() <= _ulp(ref)).all())


@pytest.mark.parametrize("n,d", [(1, 96), (17, 1024)])
def test_add_layer_norm_bf16_runs(n, d):
    """bf16 runs and is right to its rounding, loosely: Triton's interpreter casts fp32 -> bf16 by
    truncation (interpreter.py cast_impl passes no rounding mode), where the GPU rounds to nearest
    even as torch does. So here h within 1 bf16 ulp of the eager add, and y within 1 bf16 ulp of
    F.layer_norm of the kernel's own h (the truncated h moves y by up to ~rstd * 1 ulp(h), far more
    than 1 ulp of a small y); the bit-equality on the GPU is benchmarks/cuda_check.py's."""
    x, o, w = _inputs(n, d, torch.bfloat16, seed=n + d)
    h = x + o
    _, y = ck.add_layer_norm(x, o, w, EPS)
    assert bool(((x.float() - h.float()).abs() <= _ulp(h)).all())
    ref = F.layer_norm(x.float(), (d,), w.float(), None, EPS).to(torch.bfloat16)
    assert bool(((y.float() - ref.float()).abs() <= _ulp(ref)).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,d", [(1, 96), (33, 200), (17, 1024)])
def test_add_layer_norm_with_biases(n, d, dtype):
    """The decision head's variant: x += o + o_bias (o a float32 GEMM output without its bias; the
    bias added to it in float32, then the residual add, rounded once to x's dtype: bit-equal to the
    same float32 operations eagerly), y = LayerNorm(x) with the norm's bias, tolerances as above;
    `add_bias` is the same add with no norm."""
    x, o, w = _inputs(n, d, dtype, seed=3 * n + d)
    g = torch.Generator().manual_seed(n)
    o = o.float()
    ob, b = (torch.randn(d, generator=g) * 0.5).to(dtype), (torch.randn(d, generator=g) * 0.5).to(dtype)
    x2 = x.clone()
    h = (x.float() + (o + ob.float())).to(dtype)
    ref = F.layer_norm(h.float(), (d,), w.float(), b.float(), EPS).to(dtype)
    xx, y = ck.add_layer_norm(x, o, w, EPS, bias=b, o_bias=ob)
    assert xx is x and torch.equal(x, h)
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:
        assert bool(((y.float() - ref.float()).abs() <= _ulp(ref)).all())
    assert ck.add_bias(x2, o, ob) is x2 and torch.equal(x2, h)
    with pytest.raises(ValueError):
        ck.add_layer_norm(x, o, w, EPS, bias=b[:8])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("n,k", [(1, 96), (7, 200), (3, 2500)])
def test_bias_relu_equals_eager(n, k, dtype):
    """relu(x + bias) of a float32 GEMM output, computed in float32 and rounded once to the dtype:
    bit-equal to those float32 operations eagerly; split (a float32 result) bit-equal to split_fp16
    of the plain result."""
    g = torch.Generator().manual_seed(k)
    x = torch.randn(n, k, generator=g) * 3
    bias = torch.randn(k, generator=g).to(dtype)
    ref = torch.relu(x + bias.float())
    assert torch.equal(ck.bias_relu(x, bias, dtype), ref.to(dtype))
    if dtype == torch.float32:
        for terms in (2, 3):
            assert torch.equal(ck.bias_relu(x, bias, dtype, split=terms), ck.split_fp16(ref, terms))
    with pytest.raises(ValueError):
        ck.bias_relu(x, bias[:5], dtype)


def test_add_layer_norm_rejects_bad_shapes():
    x, o, w = _inputs(4, 96, torch.float32, seed=0)
    with pytest.raises(ValueError):
        ck.add_layer_norm(x, o[:, :64].contiguous(), w, EPS)
    # o of another dtype than x is allowed: a float32 residual takes 16-bit GEMM outputs (test_precision.py)
    with pytest.raises(ValueError):
        ck.add_layer_norm(x.t(), o.t(), w, EPS)                   # not contiguous
    with pytest.raises(ValueError):
        ck.add_layer_norm(x, o, w[:64], EPS)


def test_token_count_is_not_specialised():
    """n_rows changes with every CUDA-graph bucket: one compiled variant serves them all."""
    _, kernel = ck._norm_kernel()
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:                                             # the interpreter keeps the jit kwargs
        names = kernel.kwargs.get("do_not_specialize")
    assert set(names) == {"n_rows"} and set(names) <= set(kernel.arg_names)


def _count_layer_norms(model):
    """Calls of the encoder's nn.LayerNorm modules, by forward hooks."""
    calls = []
    for m in model.encoder.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("preset", ["tiny", "tiny-par"])
def test_encode_fused_vs_encode(preset, tiny_ckpt, tiny_par_ckpt, monkeypatch):
    """Hidden states of the real positions, fp32 on CPU: `encode_fused` against the eager `encode`,
    atol = rtol = 2e-5 (fp32 rounding only: a different reduction order in the norms; measured
    <= 2.6e-6 on outputs of std ~1). The fused path calls no nn.LayerNorm, 2 add_layer_norm a layer
    and 1 layer_norm (the embedding norm)."""
    path = {"tiny": tiny_ckpt, "tiny-par": tiny_par_ckpt}[preset]
    b = _batch(path)
    args = (b["input_ids"], b["attention_mask"], b.get("position_ids"), b.get("option_ids"))
    model = LayaTorch.from_checkpoint(path)
    n_layers = model.spec.num_layers
    norms = _count_layer_norms(model)
    with torch.inference_mode():
        ref = model.encode(*args)
        assert len(norms) == 2 * n_layers + 1    # embeddings, attn_norm of layers 1.., every mlp_norm, final
        norms.clear()
        model.use_fused_kernels()
        add_calls, ln_calls = _spy(monkeypatch, ck, "add_layer_norm"), _spy(monkeypatch, ck, "layer_norm")
        new = model.encode_fused(*args)
    assert (len(norms), len(add_calls), len(ln_calls)) == (0, 2 * n_layers, 1)
    m = b["attention_mask"].bool()
    assert torch.isfinite(new).all()
    torch.testing.assert_close(new[m], ref[m], atol=2e-5, rtol=2e-5)
    assert float(ref[m].std()) > 0.5                             # a real spread, not a degenerate output


def test_encode_fused_identity_norm_inside(tiny_ckpt):
    """A layer past the first without attn_norm (not ModernBERT's layout, but `encode` allows it): the
    add after the previous layer is a plain in-place add, and the results still equal `encode`."""
    b = _batch(tiny_ckpt)
    args = (b["input_ids"], b["attention_mask"])
    model = LayaTorch.from_checkpoint(tiny_ckpt)
    model.encoder.layers[2].attn_norm = None
    with torch.inference_mode():
        ref = model.encode(*args)
        model.use_fused_kernels()
        new = model.encode_fused(*args)
    m = b["attention_mask"].bool()
    torch.testing.assert_close(new[m], ref[m], atol=2e-5, rtol=2e-5)


