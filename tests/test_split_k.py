"""Split-K output GEMMs on CPU, through Triton's interpreter: benchmarks/split_k.py, an experiment
off the served path whose kernel a GPU run's study launches, and the residual add's parts input.

The kernel's partial products against float64, within a bound from float32 accumulation alone; the
residual add's kernel summing the parts in order, bit for bit; the plan's shape; and the packed
forward with split-K active (the tiny checkpoint's K is too small for the served plan, so the tests
shrink the plan's blocks) within test_precision's bounds.
"""
from __future__ import annotations

import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")

from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from benchmarks import split_k  # noqa: E402
from laya_grpc.inference.split_gemm import SplitLinear  # noqa: E402

U = 2.0 ** -24    # float32's unit roundoff


def _operands(n, k, m, terms, seed):
    """(x in the GEMM's layout, weight in SplitLinear's, scale, and the float64 terms the kernel sums)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g) * torch.logspace(-2, 2, k)
    w = torch.randn(m, k, generator=g)
    if terms == 1:
        x16, w16 = x.half(), w.half()
        return x16, w16, 1.0, [(x16.double(), w16.double())]
    if terms == 2:
        w = w.half().float()                       # fp16-exact weights: SplitLinear takes two terms
    sp = SplitLinear(w)
    assert sp.terms == terms
    x3 = ck.split_fp16(x.contiguous(), terms)
    hi, lo = x3[:, :k].double(), x3[:, k: 2 * k].double()
    w_hi = sp.w[:, :k].double()
    pairs = [(hi, w_hi), (lo, w_hi)]
    if terms == 3:
        pairs.append((hi, sp.w[:, 2 * k:].double()))
    return x3, sp.w, sp.scale, pairs


@pytest.mark.parametrize("n,k,m,parts", [(1, 64, 64, 1), (7, 200, 96, 3), (70, 300, 130, 4), (5, 640, 64, 6)])
@pytest.mark.parametrize("terms", [1, 2, 3])
def test_partial_products_sum_to_the_gemm(n, k, m, parts, terms):
    """The parts sum to the products of the fp16 operands the kernel reads (x_hi W_hi, x_lo W_hi, and
    x_hi W_lo for three terms), computed in float64. Each product of two fp16 values is exact in
    float32; the kernel's error is its float32 additions: at most terms*k within a part and parts
    when the parts are summed, each relative 2^-24 of a partial sum bounded by sum |x_i w_i|, so
    |error| <= (terms*k + parts) 2^-24 sum |x_i w_i| (+ the scale, a power of two: exact). Ragged
    shapes (n, m, k not multiples of the blocks) check the masks; parts past K are zeros."""
    x, w, scale, pairs = _operands(n, k, m, terms, seed=n * k + terms)
    out = split_k.gemm(x, w, k, terms, scale, parts)
    assert out.shape == (parts, n, m) and out.dtype == torch.float32
    ref = sum(a @ b.t() for a, b in pairs) * scale
    mag = sum(a.abs() @ b.abs().t() for a, b in pairs) * scale
    err = (out.double().sum(0) - ref).abs()
    bound = (terms * k + parts) * U * mag
    assert bool((err <= bound).all()), float((err / bound).max())


def test_partials_match_split_linear():
    """The same float32 GEMM as the cuBLAS path (SplitLinear.on_split), up to float32 accumulation."""
    n, k, m = 9, 256, 128
    x, w, scale, pairs = _operands(n, k, m, 3, seed=4)
    sp = SplitLinear.__new__(SplitLinear)
    sp.w, sp.terms, sp.scale, sp.bias = w, 3, scale, None
    cublas = sp.on_split(x).double()
    mine = split_k.gemm(x, w, k, 3, scale, 4).double().sum(0)
    mag = sum(a.abs() @ b.abs().t() for a, b in pairs) * scale
    assert bool(((mine - cublas).abs() <= 2 * (3 * k + 4) * U * mag).all())


def test_gemm_rejects_bad_operands():
    x = torch.zeros(4, 128, dtype=torch.float16)
    w = torch.zeros(32, 128, dtype=torch.float16)
    with pytest.raises(ValueError):
        split_k.gemm(x.float(), w, 128, 1, 1.0, 2)          # float32 x
    with pytest.raises(ValueError):
        split_k.gemm(x, w, 128, 2, 1.0, 2)                  # x holds no x_lo for two terms
    with pytest.raises(ValueError):
        split_k.gemm(x, w, 128, 1, 1.0, 0)


@pytest.mark.parametrize("parts,out_dtype,split", [(2, torch.float32, 0), (5, torch.float16, 0), (3, torch.float32, 2)])
def test_norm_sums_the_parts_in_order(parts, out_dtype, split):
    """add_layer_norm with o as [parts, N, d] equals add_layer_norm with o = ((o0 + o1) + o2) ...
    summed in float32 in part order: bit for bit, the residual and the normed output. Parts with
    magnitudes that cancel make any other order or a dropped part differ."""
    g = torch.Generator().manual_seed(parts)
    n, d = 6, 96
    o = torch.randn(parts, n, d, generator=g) * torch.tensor([1e4, -1e4] + [1.0] * (parts - 2))[:, None, None]
    x = torch.randn(n, d, generator=g)
    w = torch.randn(d, generator=g)
    seq = o[0].clone()
    for p in range(1, parts):
        seq = seq + o[p]
    x_a, x_b = x.clone(), x.clone()
    _, y_parts = ck.add_layer_norm(x_a, o.contiguous(), w, 1e-5, out_dtype=out_dtype, split=split)
    _, y_seq = ck.add_layer_norm(x_b, seq, w, 1e-5, out_dtype=out_dtype, split=split)
    assert torch.equal(x_a, x_b) and torch.equal(y_parts, y_seq)
    x_c = x.clone()
    ck.add_bias(x_c, o.contiguous(), torch.zeros(d))              # the add without a norm
    assert torch.equal(x_c, x_b)
    assert not torch.equal(x + o[1:].sum(0), x_b)                 # a dropped first part would be seen


def test_norm_rejects_parts_of_another_shape():
    x = torch.zeros(4, 32)
    with pytest.raises(ValueError):
        ck.add_layer_norm(x, torch.zeros(2, 4, 16), torch.ones(32), 1e-5)


def test_plan():
    """Split only at few tokens, each part at least MIN_K_PER_PART of K, about TARGET_PROGRAMS
    programs where K allows; every part holds some of K and together they cover it."""
    for tokens in (1, 64, 132, 264, 512, 513, 4096):
        for k, m in ((1024, 1024), (2624, 1024), (300, 1024)):
            parts = split_k.plan(tokens, k, m)
            if tokens > split_k.MAX_TOKENS or k < 2 * split_k.MIN_K_PER_PART:
                assert parts == 0
                continue
            assert parts == 0 or 2 <= parts <= k // split_k.MIN_K_PER_PART
            tiles = -(-tokens // split_k.BLOCK_M) * -(-m // split_k.BLOCK_N)
            if parts and parts < k // split_k.MIN_K_PER_PART:
                assert split_k.TARGET_PROGRAMS / 2 <= tiles * parts <= 2 * split_k.TARGET_PROGRAMS
            if parts:
                kp = split_k.k_per_part(k, parts)
                assert kp % split_k.BLOCK_K == 0 and parts * kp >= k > (parts - 1) * kp


def test_token_count_and_part_size_are_not_specialised():
    """Every CUDA-graph bucket reuses one compiled variant per TERMS (tokens and K per part vary)."""
    _, kernel = split_k._kernel()
    names = getattr(kernel, "do_not_specialize", None)
    if names is None:
        names = kernel.kwargs.get("do_not_specialize")
    assert set(names) == {"n", "k_part"} and set(names) <= set(kernel.arg_names)


@pytest.fixture
def small_split_k(monkeypatch):
    """Split-K installed in every LayaTorch's fused forward, the plan with blocks small enough for the
    tiny checkpoint (hidden 64, MLP 96): every output GEMM splits; returns the list of split_k.gemm calls."""
    from laya_grpc.inference.torch_model import LayaTorch
    monkeypatch.setattr(LayaTorch, "_gemm", split_k.split_k_gemm(LayaTorch._gemm))
    monkeypatch.setattr(split_k, "BLOCK_K", 16)
    monkeypatch.setattr(split_k, "MIN_K_PER_PART", 16)
    calls = []
    real = split_k.gemm

    def gemm(x, w, k, terms, scale, parts):
        calls.append((terms, parts))
        return real(x, w, k, terms, scale, parts)
    monkeypatch.setattr(split_k, "gemm", gemm)
    return calls


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # a packed bucket's spare rows hold unwritten memory
def test_served_forwards_with_split_k(tiny_ckpt, monkeypatch, small_split_k):
    """test_precision's served-precision test, with split-K taking every output GEMM: its bounds hold
    (the split parts carry the same float32 arithmetic), and each forward splits both Wo GEMMs of
    every layer, with the exact mode's 2 or 3 terms and the fast mode's 1."""
    import test_precision
    test_precision.test_served_precision_tracks_cpu_float32(tiny_ckpt, monkeypatch)
    layers = 4   # the tiny checkpoint's; three forwards with fp16 operands (the CPU float32 reference has none)
    assert len(small_split_k) == 3 * 2 * layers, small_split_k
    terms = {t for t, _ in small_split_k}
    assert 1 in terms and terms & {2, 3} and all(p >= 2 for _, p in small_split_k), small_split_k



def test_install_refuses_an_identity_norm_past_the_first_layer(tiny_ckpt):
    """The fused stack adds a plain o where a layer past the first has no attn_norm: no split there."""
    from laya_grpc.inference.torch_model import LayaTorch
    model = LayaTorch.from_checkpoint(tiny_ckpt)
    model.encoder.layers[2].attn_norm = None
    model.use_fused_kernels()
    split_k.install(model)
    with pytest.raises(ValueError, match="attn_norm"):
        model._gemm(model.encoder.layers[0].attn.Wo, torch.zeros(4, 64))
