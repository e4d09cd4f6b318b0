"""Float32 where it carries the error (inference/precision.py), on CPU through Triton's interpreter.

The new kernels against float64: `split_fp16` (a float32 activation as two fp16 halves) and
`SplitLinear` (one fp16 GEMM over the split operands, float32-accurate); `add_layer_norm` with a
float32 residual, a 16-bit addend and a 16-bit output; and the whole packed forward on a tiny
checkpoint: fp16 weights with the served precision track CPU float32 much closer than everything
in 16 bits (what was served before), and float32 weights with split GEMMs match CPU float32.
"""
from __future__ import annotations

import numpy as np
import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")

from laya_grpc.inference import cuda_attention as ca  # noqa: E402
from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from laya_grpc.inference.cuda_graphs import PackedForward  # noqa: E402
from laya_grpc.inference.packing import PackedPlan  # noqa: E402
from laya_grpc.inference.precision import Precision  # noqa: E402
from laya_grpc.inference.registry import synthetic_rows  # noqa: E402
from laya_grpc.inference import split_gemm  # noqa: E402
from laya_grpc.inference.split_gemm import SplitLinear, mm_fp32_out  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch  # noqa: E402


@pytest.mark.parametrize("n,k,terms", [(1, 64, 2), (7, 200, 2), (3, 1500, 3)])
def test_split_fp16_halves_carry_float32(n, k, terms):
    """hi = fp16(x) exactly, lo = fp16(x - hi), |hi + lo - x| <= 2^-21 |x| (fp16 keeps 11 bits of each
    half) + 2^-25 (lo's rounding where it is subnormal: an absolute floor of ~3e-8, far below what a
    row of O(1) activations resolves); [hi | lo] or [hi | lo | hi]; every element written (poisoned output)."""
    g = torch.Generator().manual_seed(n * k)
    x = torch.randn(n, k, generator=g) * torch.logspace(-3, 3, k)          # magnitudes over six decades
    real = torch.empty
    torch.empty = lambda *a, **kw: real(*a, **kw).fill_(float("nan"))       # poison the output buffer
    try:
        out = ck.split_fp16(x, terms)
    finally:
        torch.empty = real
    assert out.dtype == torch.float16 and out.shape == (n, terms * k)
    hi, lo = out[:, :k], out[:, k: 2 * k]
    assert torch.equal(hi, x.half())
    assert torch.equal(lo, (x - x.half().float()).half())
    if terms == 3:
        assert torch.equal(out[:, 2 * k:], hi)
    err = (hi.double() + lo.double() - x.double()).abs()
    assert bool((err <= 2 ** -21 * x.double().abs() + 2 ** -25).all()), float(err.max())
    assert float((err / x.double().abs())[x.abs() > 0.25].max()) < 2 ** -21     # lo normal: relative only


def test_split_fp16_rejects_bad_input():
    with pytest.raises(ValueError):
        ck.split_fp16(torch.zeros(4, 8), 4)
    with pytest.raises(ValueError):
        ck.split_fp16(torch.zeros(8, 4).t(), 2)


@pytest.mark.parametrize("exact", [True, False])
def test_split_linear_is_float32_accurate(exact):
    """y = x W^T + b against float64: fp16-exact weights take two terms, others three (with a power-of-
    two scale that keeps W_lo out of fp16's subnormals: weights of ~1e-3). Relative error (Frobenius)
    below 1e-6, where one fp16 GEMM on the same data is ~1e-3."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 200, generator=g) * 1e-3
    w = w.half().float() if exact else w
    b = torch.randn(96, generator=g)
    x = torch.randn(37, 200, generator=g) * 3
    lin = SplitLinear(w, b)
    assert lin.terms == (2 if exact else 3)
    y = lin(x)
    ref = x.double() @ w.double().t() + b.double()
    err = float((y.double() - ref).norm() / ref.norm())
    fp16 = float(((x.half().float() @ w.half().float().t() + b).double() - ref).norm() / ref.norm())
    assert y.dtype == torch.float32 and err < 1e-6, (err, fp16)
    assert fp16 > 100 * err                                      # the check can tell 16 bits from 32


def test_mm_fp32_out_does_not_round_to_16_bits():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(5, 64, generator=g).half(), torch.randn(32, 64, generator=g).half()
    y = mm_fp32_out(x, w)
    ref = x.double() @ w.double().t()
    assert y.dtype == torch.float32
    assert float((y.double() - ref).abs().max()) < 1e-5 < float((y.half().double() - ref).abs().max())


@pytest.mark.parametrize("n,d", [(1, 96), (33, 200), (17, 1024)])
def test_add_layer_norm_float32_residual(n, d):
    """x float32 += o float16 (no rounding to 16 bits), y = LayerNorm(x) rounded once to fp16."""
    g = torch.Generator().manual_seed(n + d)
    x = torch.randn(n, d, generator=g) * 4 + 3
    o = (torch.randn(n, d, generator=g) * 2).half()
    w = 1 + 0.3 * torch.randn(d, generator=g)
    h = x + o.float()
    x_out, y = ck.add_layer_norm(x, o, w, 1e-5, out_dtype=torch.float16)
    assert x_out is x and x.dtype == torch.float32 and y.dtype == torch.float16
    torch.testing.assert_close(x, h, rtol=0, atol=0)
    ref = torch.nn.functional.layer_norm(h.double(), (d,), w.double(), None, 1e-5)
    assert float((y.double() - ref).abs().max()) <= float((ref.abs().max()) * 2 ** -10)


def test_dot_precision():
    assert ca.dot_precision(torch.float16) is None and ca.dot_precision(torch.bfloat16) is None
    assert ca.dot_precision(torch.float32) == "ieee"          # interpreted here; "tf32x3" on a GPU


def _packed(model, rows):
    plan = PackedPlan(max_rows=8, max_row_tokens=512, max_batch_tokens=1024)
    return PackedForward(model, torch.device("cpu"), plan, graphs=False).forward(rows, pad_id=0)


def _to_half_head(model):
    for m in (model.scorer, model.act_head):
        m.half()


def _rms(a):
    return float(np.sqrt(np.mean(np.square(a, dtype=np.float64))))


def test_served_precision_tracks_cpu_float32(tiny_ckpt, monkeypatch):
    """fp16 weights, the packed forward: the served precision (float32 residual, Wo outputs, scorer,
    act head) against everything in 16 bits as served before, both against CPU float32.

    Asserted, without any figure measured on one processor:
    - every residual add of the served forward reads and writes float32 (x and the Wo output o),
      and the final norm hands the head float32; the 16-bit settings fail here;
    - the served error is smaller than the 16-bit error (RMS over every live logit). The 16-bit
      path rounds at every point the served one does (the GEMMs' fp16 inputs, attention) and also
      at each residual add, each Wo output and in the head: added independent rounding errors add
      variance under any IEEE round-to-nearest, whatever the GEMMs' accumulation order. With the
      16-bit settings both paths are the same computation and the strict inequality fails.
    - float32 weights with every GEMM split (the CUDA `--dtype float32` path) are float32-accurate:
      split GEMMs carry ~2^-21 relative error where the fp16 path rounds its GEMM inputs at 2^-11,
      so through the same network the error scales down by 2^-10 to first order; bound: 2^-6 of
      the served fp16 error (a 16x margin for the differing number of rounding points)."""
    ref = LayaTorch.from_checkpoint(tiny_ckpt)
    rows = synthetic_rows(6, 60, 4, ref.spec.vocab_size, seed=1)
    adds = []
    real_add = ck.add_layer_norm

    def add_layer_norm(x, o, w, eps, out_dtype=None, split=0, bias=None, o_bias=None):
        if bias is None:                        # the encoder's norms (the decision head's have a bias)
            adds.append((x.dtype, o.dtype, out_dtype))
        return real_add(x, o, w, eps, out_dtype=out_dtype, split=split, bias=bias, o_bias=o_bias)

    with torch.inference_mode():
        ref.use_fused_kernels()
        lr, ar = _packed(ref, rows)
        served = LayaTorch.from_checkpoint(tiny_ckpt, dtype=torch.float16)
        assert served.scorer[1].weight.dtype == served.act_head[0].weight.dtype == torch.float32
        served.use_fused_kernels()
        assert served.precision == Precision.for_weights(torch.float16, "cpu")
        monkeypatch.setattr(ck, "add_layer_norm", add_layer_norm)
        ls, as_ = _packed(served, rows)
        monkeypatch.setattr(ck, "add_layer_norm", real_add)
        before = LayaTorch.from_checkpoint(tiny_ckpt, dtype=torch.float16)
        _to_half_head(before)
        before.use_fused_kernels(Precision.sixteen_bit(torch.float16))
        lb, ab = _packed(before, rows)
        exact = LayaTorch.from_checkpoint(tiny_ckpt, dtype=torch.float32)
        exact.use_fused_kernels(Precision(torch.float32, torch.float32, True, True))
        le, ae = _packed(exact, rows)
    assert len(adds) == 2 * len(ref.encoder.layers) and adds[-1][2] == torch.float32, adds
    assert all(x == o == torch.float32 for x, o, _ in adds), adds
    assert np.isfinite(ls).all() and np.isfinite(as_).all()
    live = np.abs(lr) < 1e3                                      # masked option slots hold -1e4
    e_served, e_before = _rms((ls - lr)[live]), _rms((lb - lr)[live])
    assert e_served < e_before, (e_served, e_before)
    bound = 2 ** -6 * float(np.abs(ls - lr)[live].max())
    assert float(np.abs(le - lr)[live].max()) < bound, bound
    assert float(np.abs(ae - ar).max()) < 2 ** -6 * float(np.abs(as_ - ar).max()), bound


@pytest.mark.parametrize("terms", [2, 3])
def test_kernels_write_the_split_form_bit_for_bit(terms):
    """`add_layer_norm(..., split=)`, `gelu_gate(split=)` and `attention(split=)` write exactly what
    `split_fp16` makes of their float32 output (the same fp32 value, the same two roundings), so a split GEMM reading them
    multiplies the same operands. Values span fp16's range, subnormal lows and exact halves included.
    (Triton's interpreter: compiled for a GPU, lo may take an FMA's extra bits, cuda_kernels.split_store;
    benchmarks/cuda_check.py checks that bound there.)"""
    g = torch.Generator().manual_seed(3)
    n, d = 5, 96
    x = (torch.randn(n, d, generator=g) * torch.logspace(-3, 3, d)).float()
    o = torch.randn(n, d, generator=g).float()
    w = torch.randn(d, generator=g).float()
    x_a, x_b = x.clone(), x.clone()
    _, y = ck.add_layer_norm(x_a, o, w, 1e-5, out_dtype=torch.float32)
    _, ys = ck.add_layer_norm(x_b, o, w, 1e-5, out_dtype=torch.float32, split=terms)
    assert torch.equal(x_a, x_b)
    assert ys.dtype == torch.float16 and ys.shape == (n, terms * d)
    assert torch.equal(ys, ck.split_fp16(y, terms))
    u = (torch.randn(n, 2 * 80, generator=g) * 4).float()
    gate = ck.gelu_gate(u)
    gs = ck.gelu_gate(u, split=terms)
    assert gs.shape == (n, terms * 80) and torch.equal(gs, ck.split_fp16(gate, terms))
    qkv = torch.randn(2 * 40, 3 * 2 * 16, generator=g)                   # 2 rows of 40, 2 heads of 16
    cos, sin = torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g)
    lengths = torch.tensor([40, 23], dtype=torch.int32)
    a = ca.attention(qkv, cos, sin, lengths, 2, 40, 2, 8, True, 0.25)
    a_s = ca.attention(qkv, cos, sin, lengths, 2, 40, 2, 8, True, 0.25, split=terms)
    written = torch.cat([torch.arange(40), 40 + torch.arange(23)])    # rows past a row's length: not written
    assert torch.equal(a_s[written], ck.split_fp16(a[written].contiguous(), terms))


def test_split_output_needs_a_float32_result():
    with pytest.raises(ValueError, match="float32"):
        ck.gelu_gate(torch.zeros(2, 16, dtype=torch.float16), split=2)
    with pytest.raises(ValueError, match="terms"):
        ck.add_layer_norm(torch.zeros(2, 16), torch.zeros(2, 16), torch.ones(16), 1e-5, split=4)


def test_exact_mode_forward_is_unchanged_by_split_writing_kernels(tiny_ckpt, monkeypatch):
    """The exact mode's packed forward with the norms, GELU gate and attention writing their split
    GEMM's input equals, bit for bit here (interpreted; on a GPU within the FMA's bits,
    cuda_kernels.split_store), the same forward with a separate `split_fp16` launch before every GEMM; and
    it launches that kernel only where no fused kernel makes the input: layer 0's Wqkv (it reads the
    embedding norm's output, which is also the residual stream). The decision head's norms and its
    bias + ReLU kernel write their GEMMs' inputs split too."""
    exact = LayaTorch.from_checkpoint(tiny_ckpt, dtype=torch.float32)
    rows = synthetic_rows(6, 60, 4, exact.spec.vocab_size, seed=2)
    exact.use_fused_kernels(Precision(torch.float32, torch.float32, True, True))
    monkeypatch.setattr(split_gemm, "STACKED_MAX_TOKENS", 0)   # every split input as [hi | lo] (stacked: below)
    splits = []
    real_split = ck.split_fp16

    def split_fp16(x, terms):
        splits.append(x.shape)
        return real_split(x, terms)
    monkeypatch.setattr(ck, "split_fp16", split_fp16)
    with torch.inference_mode():
        fused = _packed(exact, rows)
        n_fused = len(splits)
        monkeypatch.setattr(exact, "_terms", lambda lin, dtype: 0)   # every GEMM splits its own input
        del splits[:]
        separate = _packed(exact, rows)
        n_separate = len(splits)
    layers = len(exact.encoder.layers)
    head_layers = len(exact.head.layers) if exact.head is not None else 0
    head_gemms = 4 * head_layers   # in_proj, out_proj, linear1, linear2
    assert n_separate == 4 * layers + head_gemms, (n_separate, layers, head_gemms)
    assert head_layers and n_fused == 1, (n_fused, layers, head_gemms)
    for f, s in zip(fused, separate):
        assert np.array_equal(f, s)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the dry forward's kernels read unset memory
@pytest.mark.parametrize("weights", ["float32", "float16"])
def test_allocate_only_computes_no_gemm_of_the_fused_forward(tiny_ckpt, monkeypatch, weights):
    """The warm-up's dry passes after the first run in `split_gemm.allocate_only`
    (cuda_graphs.warm_graphs). There the packed forward at CUDA's served precision (float32 weights:
    every GEMM split; float16: the fast mode's fp16 and float32-output GEMMs) computes none of its
    encoder and head-layer GEMMs, and still runs to outputs of the same shapes and dtypes. Outside
    the context the same forward computes them again, and its answers equal a forward that never
    entered it. A GEMM left outside `_mm16_fp32` and `mm16` would be counted here."""
    from types import SimpleNamespace

    from laya_grpc.inference import split_gemm
    dtype = getattr(torch, weights)
    model = LayaTorch.from_checkpoint(tiny_ckpt, dtype=dtype)
    model.use_fused_kernels(Precision.for_weights(dtype, "cuda"))
    rows = synthetic_rows(3, 40, 4, model.spec.vocab_size, seed=5)
    with torch.inference_mode():
        before = _packed(model, rows)
    calls = []
    real_mm, real_linear = torch.mm, split_gemm.F.linear

    def mm(*a, **k):
        calls.append("mm")
        return real_mm(*a, **k)

    def linear(*a, **k):
        calls.append("linear")
        return real_linear(*a, **k)
    monkeypatch.setattr(torch, "mm", mm)
    monkeypatch.setattr(split_gemm, "F", SimpleNamespace(linear=linear))
    with torch.inference_mode():
        with split_gemm.allocate_only():
            dry = _packed(model, rows)
        assert calls == []
        after = _packed(model, rows)
    layers = len(model.encoder.layers) + len(model.head.layers)
    assert len(calls) == 4 * layers, (calls, layers)   # four GEMMs a layer, encoder and head
    assert [(x.shape, x.dtype) for x in dry] == [(x.shape, x.dtype) for x in before]
    for b, a in zip(before, after):
        assert np.array_equal(b, a)


def test_stacked_halves_are_the_split_form_as_row_blocks():
    """With `stack`, `gelu_gate` and `attention` write split_fp16's two halves of their float32 output as
    row blocks [hi; lo] (bit for bit the [hi | lo] form's values); `add_layer_norm` with o as [2, N, d]
    adds o[0] + o[1] in float32 first; and `SplitLinear.on_stacked`'s two products sum to x W^T within
    float32 accumulation of 2K terms, (K + 1) 2^-24 sum |x_part w| (each product's K terms, then the add)."""
    g = torch.Generator().manual_seed(5)
    n = 5
    u = (torch.randn(n, 2 * 80, generator=g) * 4).float()
    gs, gst = ck.gelu_gate(u, split=2), ck.gelu_gate(u, split=2, stack=True)
    assert gst.shape == (2 * n, 80) and torch.equal(gst, torch.cat([gs[:, :80], gs[:, 80:]]))
    qkv = torch.randn(2 * 40, 3 * 2 * 16, generator=g)                   # 2 rows of 40, 2 heads of 16
    cos, sin = torch.randn(64, 16, generator=g), torch.randn(64, 16, generator=g)
    lengths = torch.tensor([40, 23], dtype=torch.int32)
    a_s = ca.attention(qkv, cos, sin, lengths, 2, 40, 2, 8, True, 0.25, split=2)
    a_st = ca.attention(qkv, cos, sin, lengths, 2, 40, 2, 8, True, 0.25, split=2, stack=True)
    written = torch.cat([torch.arange(40), 40 + torch.arange(23)])
    assert a_st.shape == (2 * 80, 32)
    assert torch.equal(a_st[written], a_s[written, :32]) and torch.equal(a_st[80 + written], a_s[written, 32:])
    d = 96
    x = (torch.randn(n, d, generator=g) * 3).float()
    o2 = torch.randn(2, n, d, generator=g).float()
    w = torch.randn(d, generator=g).float()
    x_a, x_b = x.clone(), x.clone()
    _, y_a = ck.add_layer_norm(x_a, o2, w, 1e-5, split=2)
    _, y_b = ck.add_layer_norm(x_b, o2[0] + o2[1], w, 1e-5, split=2)
    assert torch.equal(x_a, x_b) and torch.equal(y_a, y_b)
    with pytest.raises(ValueError):
        ck.add_layer_norm(x, torch.zeros(3, n, d), w, 1e-5)
    k, m = 200, 48
    lin = SplitLinear((torch.randn(m, k, generator=g) * k ** -0.5).half().float())   # fp16-exact: two terms
    xs = ck.split_fp16((torch.randn(n, k, generator=g) * torch.logspace(-2, 2, k)).float(), 2)
    hi, lo = xs[:, :k], xs[:, k:]
    parts = lin.on_stacked(torch.cat([hi, lo]).contiguous())
    assert parts.shape == (2, n, m) and parts.dtype == torch.float32
    wd = lin.w[:, :k].double()
    exact = hi.double() @ wd.t() + lo.double() @ wd.t()
    bound = (k + 1) * 2.0 ** -24 * (hi.double().abs() @ wd.abs().t() + lo.double().abs() @ wd.abs().t())
    assert bool(((parts[0].double() + parts[1].double()) - exact).abs().le(bound).all())
    three = SplitLinear(torch.full((m, k), 1.0 + 2.0 ** -13))                          # not fp16-exact: three terms
    assert three.terms == 3 and not split_gemm.stacked(three.terms, 1) and split_gemm.stacked(lin.terms, 1)
    assert not split_gemm.stacked(lin.terms, split_gemm.STACKED_MAX_TOKENS + 1) and not split_gemm.stacked(0, 1)
    with pytest.raises(ValueError, match="two terms"):
        three.on_stacked(torch.zeros(2 * n, k, dtype=torch.float16))


def test_exact_mode_stacks_the_wo_gemms_in_small_buckets(tiny_ckpt, monkeypatch):
    """The exact mode's packed forward runs both Wo GEMMs of every layer on stacked halves in a bucket
    of at most STACKED_MAX_TOKENS tokens and none beyond, and the two forwards' logits agree within
    float32 accumulation's reach: 2^-14 of their spread (each Wo GEMM's products summed in another
    order, ~K 2^-24 relative, through a few layers)."""
    exact = LayaTorch.from_checkpoint(tiny_ckpt, dtype=torch.float32)
    rows = synthetic_rows(6, 60, 4, exact.spec.vocab_size, seed=4)
    exact.use_fused_kernels(Precision(torch.float32, torch.float32, True, True))
    calls = []
    real = SplitLinear.on_stacked

    def on_stacked(self, x2):
        calls.append(x2.shape)
        return real(self, x2)
    monkeypatch.setattr(SplitLinear, "on_stacked", on_stacked)
    with torch.inference_mode():
        ls, as_ = _packed(exact, rows)
        assert len(calls) == 2 * len(exact.encoder.layers), calls
        monkeypatch.setattr(split_gemm, "STACKED_MAX_TOKENS", 0)
        del calls[:]
        lk, ak = _packed(exact, rows)
        assert not calls
    live = np.abs(lk) < 1e3
    spread = float(np.ptp(lk[live]))
    assert float(np.abs(ls - lk)[live].max()) <= 2 ** -14 * spread, (float(np.abs(ls - lk)[live].max()), spread)
    assert float(np.abs(as_ - ak).max()) <= 2 ** -14 * max(float(np.ptp(ak)), 1.0)
