"""Precision across checkpoints: make-checkpoint's conditionings and what CUDA serves by default.

The conditionings keep upstream's layout and shapes and move only what sets how sharp the answers
are (temperatures, the scorer's gain, the weights' distribution); the default conditioning writes the
bytes it always wrote. Through Triton's interpreter, on the sharp conditioning: the 16-bit mode's
error and the exact mode's (split-fp16 GEMMs: float32-accurate) against the same network in
float64. Rounding errors propagate to first order linearly, so their ratio follows the ratio of the
unit roundoffs that enter: fp16 inputs (2^-11) against split pairs and float32 accumulation (2^-22
and a few 2^-24): about 2^-10; asserted at 2^-7 (8x margin for the mix of sources). The CUDA default
is the exact mode (docs/precision.md).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")

from safetensors.numpy import load_file  # noqa: E402

from laya_grpc import cli  # noqa: E402
from laya_grpc.cli.make_checkpoint import (CONDITIONINGS, PRESETS, TEMPERATURE, make_checkpoint,  # noqa: E402
                                           random_weights)
from laya_grpc.core.checkpoints.checkpoint import open_checkpoint  # noqa: E402
from laya_grpc.core.checkpoints.shapes import Dims  # noqa: E402
from laya_grpc.core.decisions.temperatures import Temperatures  # noqa: E402
from laya_grpc.inference.cuda_graphs import PackedForward  # noqa: E402
from laya_grpc.inference.devices import torch_dtype  # noqa: E402
from laya_grpc.inference.packing import PackedPlan  # noqa: E402
from laya_grpc.inference.precision import Precision  # noqa: E402
from laya_grpc.inference.registry import synthetic_rows  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch  # noqa: E402


@pytest.fixture(scope="module")
def conditioned(tmp_path_factory):
    root = tmp_path_factory.mktemp("cond")
    return {c: make_checkpoint(str(root / c), "tiny", conditioning=c) for c in CONDITIONINGS}


def _cfg(path):
    with open(os.path.join(path, "rl_agent_config.json")) as f:
        return json.load(f)


def test_default_conditioning_writes_the_same_weights(conditioned):
    p = PRESETS["tiny"]
    w = load_file(os.path.join(conditioned["default"], "model.safetensors"))
    vocab = w["encoder.embeddings.tok_embeddings.weight"].shape[0]
    dims = Dims(vocab_size=vocab, hidden_size=p.hidden_size, num_layers=p.num_layers,
                intermediate_size=p.intermediate_size, head_layers=2, n_act=2)
    before = random_weights(dims, p.scorer_gain, 0)          # the generator's default arguments
    assert set(w) == set(before) and all(np.array_equal(w[k], before[k]) for k in w)
    assert _cfg(conditioned["default"])["temperature"] == TEMPERATURE


def test_conditionings_keep_the_layout_and_move_sharpness(conditioned):
    ref = load_file(os.path.join(conditioned["default"], "model.safetensors"))
    for name, c in CONDITIONINGS.items():
        path = conditioned[name]
        open_checkpoint(path)                                           # strict layout and config checks
        w = load_file(os.path.join(path, "model.safetensors"))
        assert {k: v.shape for k, v in w.items()} == {k: v.shape for k, v in ref.items()}
        assert all(v.dtype == np.float16 for v in w.values())
        t = Temperatures.from_config(_cfg(path))
        if c.temperature is not None:                                   # every question type and option count
            assert set(t.per_type) == set(t.by_options.values()) == {c.temperature}
        # the same draws scaled: the scorer's output gain is the conditioning's (fp16 rounding apart)
        s = w["scorer.3.weight"].astype(np.float64)
        if c.distribution == "normal":
            r = ref["scorer.3.weight"].astype(np.float64)
            assert np.allclose(s, r * c.scorer_gain_x, rtol=2 ** -10, atol=2 ** -24), name
        # distributions at unit variance: uniform draws lie within sqrt(3) std; Laplace has heavy tails
        m = w["encoder.layers.1.mlp.Wi.weight"].astype(np.float64) * np.sqrt(PRESETS["tiny"].hidden_size)
        kurt = float(((m - m.mean()) ** 4).mean() / m.var() ** 2)
        assert abs(m.std() - 1) < 0.05, (name, m.std())                   # 12288 draws: std error ~0.6%
        if c.distribution == "uniform":
            assert np.abs(m).max() <= np.sqrt(3) * (1 + 2 ** -10) and kurt < 2.0, (name, kurt)   # 1.8
        elif c.distribution == "laplace":
            assert kurt > 4.5, (name, kurt)                                                     # 6
        else:
            assert 2.6 < kurt < 3.4, (name, kurt)                                              # 3
    assert CONDITIONINGS["sharp"].temperature == 0.5 and CONDITIONINGS["sharp"].scorer_gain_x > 1


def test_make_checkpoint_cli_overrides(tmp_path):
    target = str(tmp_path / "c")
    assert cli.main(["make-checkpoint", target, "--preset", "tiny", "--conditioning", "flat",
                     "--temperature", "0.5", "--scorer-gain", "7", "--distribution", "laplace"]) == 0
    cfg = _cfg(target)
    assert cfg["temperature"] == [0.5] * 3 and set(cfg["temperature_by_options"].values()) == {0.5}
    for bad in (["--temperature", "0.4"], ["--scorer-gain", "0"]):
        assert cli.main(["make-checkpoint", str(tmp_path / "x"), "--preset", "tiny"] + bad) == 2


def test_cuda_default_is_the_exact_mode():
    assert torch_dtype("auto", "cuda") is torch.float32 and torch_dtype("auto", "cuda:1") is torch.float32
    exact = Precision.for_weights(torch.float32, "cuda")
    assert exact.split_head and exact.split_encoder
    fast = Precision.for_weights(torch.float16, "cuda")          # `--dtype float16`: the fast mode by name
    assert not fast.split_head and not fast.split_encoder and fast.residual == torch.float32


def _packed(model, rows):
    plan = PackedPlan(max_rows=8, max_row_tokens=512, max_batch_tokens=1024)
    return PackedForward(model, torch.device("cpu"), plan, graphs=False).forward(rows, pad_id=0)


def test_exact_mode_error_follows_unit_roundoff_on_a_sharp_checkpoint(conditioned):
    path = conditioned["sharp"]
    temps = Temperatures.from_config(_cfg(path))
    ref = LayaTorch.from_checkpoint(path, "cpu", torch.float64).double()
    rows = synthetic_rows(3, 60, 4, ref.spec.vocab_size, seed=3)
    pad = {k: torch.from_numpy(v) for k, v in rows.pad(0).items()}
    with torch.inference_mode():
        lr, _ = ref(pad["input_ids"], pad["attention_mask"], pad["marker_pos"], pad["marker_mask"], pad["qtype"])
        fast = LayaTorch.from_checkpoint(path, dtype=torch.float16)
        fast.use_fused_kernels(Precision.for_weights(torch.float16, "cuda"))    # as `--dtype float16` on CUDA
        lf, _ = _packed(fast, rows)
        exact = LayaTorch.from_checkpoint(path, dtype=torch.float32)
        exact.use_fused_kernels(Precision.for_weights(torch.float32, "cuda"))   # what CUDA serves by default
        le, _ = _packed(exact, rows)
    lr = lr.numpy()

    def worst(lg):     # max |d(z/T)|: logits over the row's temperature, centred (softmax ignores a shift)
        out = 0.0
        for i in range(rows.n):
            k = int(rows.marker_counts[i])
            t = temps.for_question(int(rows.qtypes[i]), k)
            d = (lg[i, :k].astype(np.float64) - lr[i, :k]) / t
            out = max(out, float(np.abs(d - d.mean()).max()))
        return out

    e_fast, e_exact = worst(lf), worst(le)
    assert np.isfinite(lf).all() and np.isfinite(le).all()
    assert e_fast > 2 ** -11, e_fast             # the 16-bit error is there to be measured
    assert e_exact <= 2 ** -7 * e_fast, (e_exact, e_fast)


def test_split_head_runs_the_head_in_float32(conditioned):
    m = LayaTorch.from_checkpoint(conditioned["sharp"], dtype=torch.float16)
    m.use_fused_kernels(Precision(torch.float32, torch.float32, True, False))
    assert m.type_emb.weight.dtype == torch.float32
    assert {p.dtype for p in m.head.parameters()} == {torch.float32}
    assert m.encoder.layers[0].attn.Wqkv.weight.dtype == torch.float16


def test_parity_stage_resolves_auto_as_the_server_does(tmp_path):
    from laya_grpc.bench.parity import STAGE_CONDITIONINGS, served_dtype, stage_checkpoints
    assert served_dtype("auto", "cuda:0") == "float32" and served_dtype("auto", "cpu") == "float32"
    assert served_dtype("auto", "mps") == "float16" and served_dtype("float16", "cuda") == "float16"
    made = stage_checkpoints(str(tmp_path), "tiny", ("default", "sharp"))
    assert made == [("default", str(tmp_path / "tiny")), ("sharp", str(tmp_path / "tiny-sharp"))]
    assert _cfg(made[1][1])["temperature"] == [0.5] * 3 and len(STAGE_CONDITIONINGS) >= 4
