"""Plain-torch forward (`laya_grpc.inference.torch_model.LayaTorch`) vs upstream laya 0.4.15's own model.

Upstream encodes and collates the rows itself (`Agent._encode_state` + `collate_items`) and runs
`agent.model` on CPU fp32; the same tensors go through LayaTorch. Rows cover padding, 1..14
markers, a single-marker batch (K=1), states far beyond the sliding window (tiny's
local_attention is 16) and rows cut at max_len, the Gemma-like tokenizer (tiny-ml) and the
parallel option layout (tiny-par). `PackedRows.pad` (what production pads with) must rebuild
upstream's arrays exactly, and a damaged weight file must fail at load with the tensor named.
"""
from __future__ import annotations

import json
import shutil
import time
from types import SimpleNamespace

import numpy as np
import pytest

laya = pytest.importorskip("laya")
torch = pytest.importorskip("torch")

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from laya.common import collate_items  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from laya_grpc.inference.devices import pick_device, torch_dtype  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch  # noqa: E402
from laya_grpc.core.errors import CheckpointError, Kind, LayaError  # noqa: E402
from laya_grpc.core.wire.packed_rows import PackedRows  # noqa: E402

PRESETS = ("tiny", "tiny-ml", "tiny-par")
TOL = 1e-4
INPUTS = ("input_ids", "attention_mask", "marker_pos", "marker_mask", "qtype")

STATES = [
    "Short.",
    "I was charged twice for order 4711. Please refund the duplicate payment today. " * 40,
    {"customer": "Ana", "order": 4711, "notes": ["late", "damaged box"], "amount": 12.5},
    ["user: hello", "agent: how can I help?", "user: my parcel never arrived, I want my money back"],
]
QUESTIONS = {
    **{"c%d" % n: {"type": "choice", "instructions": "Pick one of %d." % n,
                   "criteria": {"opt_%d" % i: "description %d" % i for i in range(n)}} for n in range(1, 15)},
    "urgency": {"type": "score", "instructions": "How urgent is it?",
                "criteria": ["not urgent", "soon", "immediately"]},
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
}


def _groups(agent, questions: dict) -> list:
    internal = {qid: agent._to_internal(q) for qid, q in questions.items()}
    return [agent._encode_state(s, list(questions), internal) for s in STATES]


def _run(model, b: dict):
    kw = {"position_ids": b["position_ids"], "option_ids": b["option_ids"]} if "option_ids" in b else {}
    with torch.no_grad():
        logits, act = model(*(b[k] for k in INPUTS), **kw)
    return logits, act


@pytest.fixture(scope="module", params=PRESETS)
def case(request, tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt, upstream_agent):
    path = {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt}[request.param]
    agent = upstream_agent(path)
    groups = [_groups(agent, QUESTIONS), _groups(agent, {"c1": QUESTIONS["c1"]})]
    return request.param, path, agent, groups


def test_forward_matches_upstream(case):
    preset, path, agent, groups = case
    ours = LayaTorch.from_checkpoint(path)
    max_len = agent.cfg.get("max_len", 512)
    for g in groups:
        b = collate_items(g, agent.tok.pad_token_id)
        assert ("option_ids" in b) == (preset == "tiny-par")
        width = b["input_ids"].shape[1]
        lengths = b["attention_mask"].sum(-1)
        if b["marker_mask"].shape[1] > 1:   # the full batch: padded rows, long and max_len rows
            assert width == max_len and int(lengths.min()) < 64
            assert set(b["marker_mask"].sum(-1).tolist()) >= set(range(1, 15))
        up_l, up_a = _run(agent.model, b)
        t0 = time.perf_counter()
        our_l, our_a = _run(ours, b)
        ms = (time.perf_counter() - t0) * 1e3
        assert our_l.dtype == torch.float32 and our_a.dtype == torch.float32
        dl = (our_l - up_l.float()).abs().max().item()
        da = (our_a - up_a.float()).abs().max().item()
        print("%s batch %s: max|dlogits| %.3g max|dact| %.3g forward %.1f ms"
              % (preset, tuple(b["input_ids"].shape), dl, da, ms))
        assert dl < TOL and da < TOL
        # the padded marker slots carry upstream's sentinel, not a score
        assert torch.equal(our_l[~b["marker_mask"]], torch.full_like(our_l[~b["marker_mask"]], -1e4))


def test_packed_rows_pad_matches_upstream_collate(case):
    _, _, agent, groups = case
    for g in groups:
        ref = collate_items(g, agent.tok.pad_token_id)
        rows = [SimpleNamespace(ids=it["ids"], markers=it["markers"], qtype=it["qtype"],
                                position_ids=it["layout"]["position_ids"] if "layout" in it else None,
                                option_ids=it["layout"]["option_ids"] if "layout" in it else None)
                for grp in g for it in grp]
        ours = PackedRows.from_rows(rows).pad(agent.tok.pad_token_id)
        keys = INPUTS + (("position_ids", "option_ids") if "option_ids" in ref else ())
        assert set(ours) == set(keys)
        for k in keys:
            want = ref[k].numpy()
            assert ours[k].dtype == want.dtype, k
            np.testing.assert_array_equal(ours[k], want, err_msg=k)


def test_bf16_declared_encoder_matches_upstream(case, tmp_path):
    """Upstream builds the encoder in the dtype encoder/config.json declares.

    Both sides run SDPA's math kernel: torch's fused CPU kernel for bf16 picks its code by the
    processor while ATen dispatches by ATEN_CPU_CAPABILITY, and with the two apart (`default` on an
    AVX-512/AMX machine) it raises inside torch; the dtype, which is what is checked, is the same."""
    preset, path, agent, groups = case
    if preset != "tiny":
        pytest.skip("one fixture is enough")
    copy = tmp_path / "bf16"
    shutil.copytree(path, copy)
    cfg_path = copy / "encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["dtype"] = "bfloat16"
    cfg_path.write_text(json.dumps(cfg, indent=2))
    upstream = laya.load(str(copy), device="cpu").model
    ours = LayaTorch.from_checkpoint(str(copy))
    assert ours.encoder.layers[0].attn.Wqkv.weight.dtype == torch.bfloat16
    assert ours.type_emb.weight.dtype == torch.float32
    b = collate_items(groups[0], agent.tok.pad_token_id)
    with sdpa_kernel(SDPBackend.MATH):
        (ul, ua), (ol, oa) = _run(upstream, b), _run(ours, b)
        fp32_l, _ = _run(agent.model, b)
    assert (ul - fp32_l).abs().max().item() > 0      # the declared dtype really changes upstream
    assert (ol - ul).abs().max().item() < TOL and (oa - ua.float()).abs().max().item() < TOL


@pytest.mark.parametrize("damage, named", [
    ("drop", "missing tensors: encoder.layers.1.attn.Wo.weight"),
    ("reshape", "wrong shapes: scorer.1.weight"),
    ("extra", "unexpected tensors: encoder.layers.9.attn.Wo.weight"),
])
def test_damaged_weights_are_refused(tiny_ckpt, tmp_path, damage, named):
    path = str(tmp_path / "ckpt")
    shutil.copytree(tiny_ckpt, path)
    weights = path + "/model.safetensors"
    tensors = load_file(weights)
    if damage == "drop":
        del tensors["encoder.layers.1.attn.Wo.weight"]
    elif damage == "reshape":
        tensors["scorer.1.weight"] = tensors["scorer.1.weight"][:, :-1].contiguous()
    else:
        tensors["encoder.layers.9.attn.Wo.weight"] = tensors["encoder.layers.1.attn.Wo.weight"].clone()
    save_file(tensors, weights)
    with pytest.raises(CheckpointError) as err:
        LayaTorch.from_checkpoint(path)
    assert err.value.kind is Kind.CHECKPOINT
    assert named in err.value.detail and "model.safetensors" in err.value.detail


def test_missing_weight_file_and_bad_config_are_refused(tiny_ckpt, tmp_path):
    path = str(tmp_path / "ckpt")
    shutil.copytree(tiny_ckpt, path)
    cfg_path = tmp_path / "ckpt" / "encoder" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "hidden_activation": "gelu_new"}))
    with pytest.raises(CheckpointError, match="hidden_activation='gelu_new' is not supported"):
        LayaTorch.from_checkpoint(path)
    cfg_path.write_text(json.dumps(cfg))
    (tmp_path / "ckpt" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="weights file is missing"):
        LayaTorch.from_checkpoint(path)


def test_device_pick_is_never_silent():
    p = pick_device("cpu", "torch", require=False)
    assert (p.device, p.fallback) == ("cpu", False)
    p = pick_device("auto", "torch", require=False)
    assert p.device in ("cuda:0", "mps", "cpu") and not p.fallback and p.reason.startswith("auto:")
    with pytest.raises(LayaError) as err:
        pick_device("tpu", "torch", require=False)
    assert err.value.kind is Kind.INVALID
    missing = "cuda:%d" % (torch.cuda.device_count() + 3)
    with pytest.raises(LayaError, match="refusing to start") as err:
        pick_device(missing, "torch", require=True)
    assert err.value.kind is Kind.DEVICE
    p = pick_device(missing, "torch", require=False)
    assert p.device == "cpu" and p.fallback and p.requested == missing and "fell back to cpu" in p.reason


def test_dtype_policy_keeps_cpu_exact_to_upstream():
    assert torch_dtype("auto", "cpu") is None            # upstream's CPU load: config dtype, fp32 head
    assert torch_dtype("auto", "cuda:0") is torch.float32 and torch_dtype(None, "mps") is torch.float16
    assert torch_dtype("bf16", "cuda:0") is torch.bfloat16 and torch_dtype("float32", "cuda:0") is torch.float32
    with pytest.raises(LayaError):
        torch_dtype("int8", "cpu")
