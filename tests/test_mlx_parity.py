"""MLX forward (`laya_grpc.inference.mlx_model.LayaMLX`) vs upstream laya 0.4.15's own model forward.

Upstream encodes and collates the rows itself (`Agent._encode_state` + `collate_items`), runs
`agent.model` on CPU fp32, and the same numpy arrays go through MLX. Rows cover padding,
1..14 markers, single-marker batches, states far longer than the sliding window (tiny's
local_attention is 16), the Gemma-like tokenizer (tiny-ml) and the parallel option layout (tiny-par).
fp32 must agree to float rounding; fp16 to what half precision allows.
"""
from __future__ import annotations

import platform
import shutil

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
laya = pytest.importorskip("laya")
torch = pytest.importorskip("torch")

from laya.common import collate_items  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from laya_grpc.inference.mlx_model import LayaMLX  # noqa: E402
from laya_grpc.core.errors import CheckpointError, Kind, LayaError  # noqa: E402

PRESETS = ("tiny", "tiny-ml", "tiny-par")
FP32_TOL = 1e-4
FP16_PROB_TOL = 1e-2
FP16_TIE_MARGIN = 0.04   # fp16 may flip an argmax only between options closer than this

LONG = "I was charged twice for order 4711. Please refund the duplicate payment today. " * 6
QUESTIONS = {
    **{"c%d" % n: {"type": "choice", "instructions": "Pick one of %d." % n,
                   "criteria": {"opt_%d" % i: "description %d" % i for i in range(n)}} for n in range(1, 15)},
    "urgency": {"type": "score", "instructions": "How urgent is it?",
                "criteria": ["not urgent", "soon", "immediately"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
}
# (state, question ids): every marker count 1..14 once, the long state (~6x the sliding window of the
# tiny presets) with small questions so the batch stays cheap on MLX's CPU backend.
GROUPS = [
    ("Short.", ["c%d" % n for n in range(1, 8)]),
    ({"customer": "Ana", "order": 4711, "notes": ["late", "damaged box"]}, ["c%d" % n for n in range(8, 15)]),
    (LONG, ["c1", "c2", "urgency", "refund"]),
    (["user: hello", "agent: how can I help?", "user: my parcel never arrived"], ["c5", "refund"]),
]


def _batch(agent, groups) -> dict:
    """Upstream's own rows for every (state, question), collated into one padded batch."""
    internal = {qid: agent._to_internal(q) for qid, q in QUESTIONS.items()}
    return collate_items([agent._encode_state(s, qids, internal) for s, qids in groups], agent.tok.pad_token_id)


def _inputs(b: dict) -> list:
    args = [b[k].numpy() for k in ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")]
    if "option_ids" in b:
        args += [b["position_ids"].numpy(), b["option_ids"].numpy()]
    return args


def _upstream(agent, b: dict):
    kw = {"position_ids": b["position_ids"], "option_ids": b["option_ids"]} if "option_ids" in b else {}
    with torch.no_grad():
        logits, act = agent.model(b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"],
                                  b["qtype"], **kw)
    return logits.float().numpy(), act.float().numpy()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.fixture(scope="module", params=PRESETS)
def case(request, tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt, upstream_agent):
    path = {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt}[request.param]
    agent = upstream_agent(path)
    batches = [_batch(agent, GROUPS), _batch(agent, [(s, ["c1"]) for s, _ in GROUPS])]
    assert ("option_ids" in batches[0]) == (request.param == "tiny-par")
    return path, [(_inputs(b), _upstream(agent, b)) for b in batches]


def test_batches_cover_the_hard_cases(case):
    _, runs = case
    (ids, att, _, mmask, _, *_), _ = runs[0]
    lengths = att.sum(1)
    assert lengths.min() < lengths.max()                 # padding
    assert lengths.max() > 16 * 4                        # far past the tiny sliding window (local_attention 16)
    assert set(mmask.sum(1)) == set(range(1, 15))         # 1..14 markers (score: 3, noul: 2)
    assert runs[1][0][3].shape[1] == 1                   # a batch whose widest question has one marker


def test_fp32_matches_upstream(case):
    path, runs = case
    model = LayaMLX.from_checkpoint(path, dtype="float32")
    for inputs, (ref_logits, ref_act) in runs:
        logits, act = model.forward(*inputs)
        assert logits.dtype == np.float32 and act.dtype == np.float32
        assert logits.shape == ref_logits.shape and act.shape == ref_act.shape
        assert np.abs(logits - ref_logits).max() < FP32_TOL
        assert np.abs(act - ref_act).max() < FP32_TOL
        assert np.abs(_softmax(logits) - _softmax(ref_logits)).max() < FP32_TOL
        assert np.abs(_softmax(act) - _softmax(ref_act)).max() < FP32_TOL


def test_fp16_close_to_upstream(case):
    path, runs = case
    model = LayaMLX.from_checkpoint(path, dtype="float16")
    for inputs, (ref_logits, ref_act) in runs:
        logits, act = model.forward(*inputs)
        p, ref_p = _softmax(logits), _softmax(ref_logits)
        assert np.isfinite(logits).all() and np.isfinite(act).all()
        assert np.abs(p - ref_p).max() < FP16_PROB_TOL
        assert np.abs(_softmax(act) - _softmax(ref_act)).max() < FP16_PROB_TOL
        top2 = -np.sort(-ref_p, axis=-1)[:, :2]
        margin = top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0.0)
        flipped = p.argmax(-1) != ref_p.argmax(-1)
        assert not (flipped & (margin >= FP16_TIE_MARGIN)).any()


def test_compiled_forward_equals_eager(case):
    path, runs = case
    eager = LayaMLX.from_checkpoint(path, dtype="float32")
    compiled = LayaMLX.from_checkpoint(path, dtype="float32", compile=True)
    inputs, _ = runs[0]
    for a, b in zip(eager.forward(*inputs), compiled.forward(*inputs)):
        assert np.abs(a - b).max() < 1e-5


def test_device_is_what_mlx_runs_on(case):
    model = LayaMLX.from_checkpoint(case[0])
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        assert model.device == "mlx:gpu" and mx.metal.is_available()
    else:  # MLX has no GPU backend on this platform in the mlx[cpu] build
        assert model.device == "mlx:cpu"


def test_bad_inputs_are_refused(case):
    path, runs = case
    model = LayaMLX.from_checkpoint(path)
    ids, *rest = runs[0][0]
    with pytest.raises(LayaError) as e:   # MLX gathers would read garbage instead of failing
        model.forward(ids + model.spec.vocab_size, *rest)
    assert e.value.kind is Kind.INVALID and "token id" in e.value.detail
    with pytest.raises(LayaError) as e:
        LayaMLX.from_checkpoint(path, dtype="bfloat8")
    assert e.value.kind is Kind.INVALID


def test_missing_tensor_is_a_checkpoint_error(case, tmp_path):
    path = str(tmp_path / "broken")
    shutil.copytree(case[0], path)
    tensors = load_file(path + "/model.safetensors")
    del tensors["head.layers.1.linear2.bias"]
    save_file(tensors, path + "/model.safetensors")
    with pytest.raises(CheckpointError) as e:
        LayaMLX.from_checkpoint(path)
    assert "head.layers.1.linear2.bias" in e.value.detail
