"""The CUDA fused encoder on CPU: its Triton kernels run through Triton's interpreter
(TRITON_INTERPRET=1), so CI, which has no GPU, checks the same kernel code the H200 runs.

The kernels against the eager ops they replace (fresh random inputs, odd head counts and widths,
both option layouts), `encode_fused` against the reference `encode` on real tokenized rows, and
the runner's choice of kernels (never fused off CUDA, never silently).
"""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ["TRITON_INTERPRET"] = "1"   # before triton is imported: its own jit helpers read it too
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import torch.nn.functional as F  # noqa: E402

from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from laya_grpc.inference.runners import TorchRunner, resolve_kernels  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch, _rotate_half  # noqa: E402
from laya_grpc.core.errors import LayaError  # noqa: E402
from laya_grpc.core.wire.packed_rows import PackedRows  # noqa: E402
from laya_grpc.core.decisions.questions import parse_questions  # noqa: E402
from laya_grpc.core.checkpoints.sources import open_source  # noqa: E402
from laya_grpc.tokenizer.encoding import TextEncoder  # noqa: E402


@pytest.mark.parametrize("B,L,H,hd,par,dtype", [(2, 24, 4, 16, False, torch.float32), (3, 20, 3, 12, True, torch.float32),
                                                (1, 33, 4, 16, True, torch.float16)])
def test_rope_kernel_equals_transformers_rotation(B, L, H, hd, par, dtype):
    g = torch.Generator().manual_seed(B * L)
    qkv = torch.randn(B * L, 3 * H * hd, generator=g).to(dtype)
    cos, sin = (torch.randn(64, hd, generator=g).to(dtype) for _ in range(2))
    pos = torch.randint(0, L, (B, L), generator=g) if par else None
    out = ck.rope_qk(qkv, cos, sin, pos, B, L, H)
    p = pos.reshape(-1) if par else torch.arange(L).repeat(B)
    c, s = cos[p][:, None].float(), sin[p][:, None].float()
    x = qkv.view(B * L, 3, H, hd)[:, :2].float()
    ref = torch.stack([(x[:, i] * c + _rotate_half(x[:, i]) * s).to(dtype) for i in range(2)])
    tol = 1e-6 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("n,inter,dtype", [(5, 96, torch.float32), (3, 2500, torch.float32), (4, 160, torch.float16)])
def test_gelu_gate_kernel_equals_eager(n, inter, dtype):
    x = (torch.randn(n, 2 * inter, generator=torch.Generator().manual_seed(inter)) * 3).to(dtype)
    u, gate = x.chunk(2, dim=-1)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(ck.gelu_gate(x), F.gelu(u) * gate, atol=tol, rtol=tol)


def _batch(path: str) -> dict:
    c = open_source(path)
    enc = TextEncoder(c.tokenizer_dir, max_len=c.max_len, head_max_len=c.head_max_len, parallel_layout=c.parallel)
    qs = parse_questions({"c%d" % n: {"type": "choice", "instructions": "Pick one of %d." % n,
                                      "criteria": {"o%d" % i: "option %d" % i for i in range(n)}} for n in (2, 5)})
    states = ["Short.", "My parcel never arrived and I want my money back today, please. " * 3]
    rows = [r for e in enc.encode_many(states, qs) for r in e.rows]
    return {k: torch.from_numpy(v) for k, v in PackedRows.from_rows(rows).pad(int(c.special.pad_id)).items()}


@pytest.mark.parametrize("one_row", [False, True])
@pytest.mark.parametrize("preset", ["tiny", "tiny-par"])
def test_fused_encoder_equals_reference(preset, one_row, tiny_ckpt, tiny_par_ckpt):
    """The fused padded forward against the reference, on a batch and on one row (a batch of one
    broadcasts its type embedding over a single row: a stride-0 view the fused head must copy)."""
    path = {"tiny": tiny_ckpt, "tiny-par": tiny_par_ckpt}[preset]
    b = _batch(path)
    if one_row:
        b = {k: v[:1] for k, v in b.items()}
    assert ("option_ids" in b) == (preset == "tiny-par")
    model = LayaTorch.from_checkpoint(path)
    args = (b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"],
            b.get("position_ids"), b.get("option_ids"))
    with torch.inference_mode():
        ref = model(*args)
        model.use_fused_kernels()
        fused = model(*args)
    assert model.kernels == "fused"
    for r, f in zip(ref, fused):
        assert np.isfinite(f.numpy()).all()
        torch.testing.assert_close(f, r, atol=1e-4, rtol=1e-4)
    assert float(ref[0].abs().max()) > 0.5      # a real spread of logits, not a degenerate zero output


def _split_calls(monkeypatch, method: str) -> list:
    """The ids of the SplitLinears whose `method` (on_split, on_stacked) runs from now on."""
    from laya_grpc.inference.split_gemm import SplitLinear
    called, real = [], getattr(SplitLinear, method)

    def spy(self, x):
        called.append(id(self))
        return real(self, x)
    monkeypatch.setattr(SplitLinear, method, spy)
    return called


def _exact_within_fast(path, args, called: list):
    """The reference forward, the fast mode's and the exact mode's (`called` emptied just before the
    exact one); asserts the exact mode's error against CPU float32 is under 2^-6 of the fast mode's.
    Bound from the arithmetic: split GEMMs carry ~2^-21 relative error where the fast mode rounds each
    GEMM input to fp16 at 2^-11, so through the same network the exact mode's error is ~2^-10 of the
    fast mode's to first order (a 16x margin for the differing number of rounding points). Returns
    the exact model."""
    from laya_grpc.inference.precision import Precision
    with torch.inference_mode():
        ref = LayaTorch.from_checkpoint(path)(*args)
        fast = LayaTorch.from_checkpoint(path, dtype=torch.float16)
        fast.use_fused_kernels()
        lf, af = fast(*args)
        exact = LayaTorch.from_checkpoint(path, dtype=torch.float32)
        exact.use_fused_kernels(Precision(torch.float32, torch.float32, True, True))
        del called[:]
        le, ae = exact(*args)
    live = ref[0].abs() < 1e3                                      # masked option slots hold -1e4
    for e, f, r in ((le[live], lf[live], ref[0][live]), (ae, af, ref[1])):
        assert np.isfinite(e.numpy()).all()
        fast_err = float((f.float() - r).abs().max())
        assert fast_err > 0 and float((e - r).abs().max()) < 2 ** -6 * fast_err, fast_err
    return exact


def test_padded_exact_forward_splits_the_head_gemms(tiny_par_ckpt, monkeypatch):
    """The padded forward (parallel option layouts) in the exact mode runs every decision-head GEMM
    through its SplitLinear, as the packed forward does (not torch's fused float32 layer, which runs
    on a GPU's CUDA cores), and stays float32-accurate (`_exact_within_fast`)."""
    b = _batch(tiny_par_ckpt)
    args = (b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"],
            b["position_ids"], b["option_ids"])
    called = _split_calls(monkeypatch, "on_split")
    exact = _exact_within_fast(tiny_par_ckpt, args, called)
    head = [id(exact._split[id(m)]) for layer in exact.head.layers
            for m in (layer.self_attn, layer.self_attn.out_proj, layer.linear1, layer.linear2)]
    assert head and set(head) <= set(called), "head GEMMs not split"


def test_padded_exact_forward_stacks_the_wo_gemms(tiny_ckpt, monkeypatch):
    """The padded forward (sequential layout: one attention kernel) in the exact mode runs both Wo
    GEMMs of every layer, and only those, on stacked halves in a bucket of at most STACKED_MAX_TOKENS
    tokens, and stays float32-accurate (`_exact_within_fast`)."""
    b = _batch(tiny_ckpt)
    args = (b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"])
    stacked = _split_calls(monkeypatch, "on_stacked")
    exact = _exact_within_fast(tiny_ckpt, args, stacked)
    wo = [id(exact._split[id(m)]) for layer in exact.encoder.layers for m in (layer.attn.Wo, layer.mlp.Wo)]
    assert sorted(stacked) == sorted(wo), "Wo GEMMs not stacked"


def test_kernel_choice_is_explicit(tiny_ckpt):
    assert resolve_kernels("auto", "cpu") == "reference"
    assert resolve_kernels("reference", "cuda") == "reference"
    with pytest.raises(LayaError, match="needs a CUDA device"):
        resolve_kernels("fused", "cpu")
    with pytest.raises(LayaError, match="must be one of"):
        resolve_kernels("fast", "cuda")
    assert ck.available() == (True, "")
    assert TorchRunner(tiny_ckpt, "cpu", None).kernels == "reference"
