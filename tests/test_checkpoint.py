"""Synthetic checkpoints load in upstream laya 0.4.15, and `open_checkpoint` validates strictly.

Upstream is the judge of the layout: each tiny preset must load with `strict=True` and answer
with probabilities that are far from uniform (else parity tests would prove nothing). Every
validation failure is checked on a corrupted copy of a real tiny checkpoint.
"""
from __future__ import annotations

import filecmp
import json
import math
import os
import shutil
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from laya_grpc import cli
from laya_grpc.core.checkpoints.checkpoint import PINNED_REVISIONS, open_checkpoint
from laya_grpc.core.checkpoints.shapes import Dims, parameter_count, tensor_shapes
from laya_grpc.core.errors import CheckpointError, Kind
from laya_grpc.cli.make_checkpoint import PRESETS, make_checkpoint
from laya_grpc.core.decisions.temperatures import Temperatures, clamp_temperature, temperature_rejected

QUESTIONS = {
    "dept": {"type": "choice", "instructions": "Which department should handle this ticket?",
             "criteria": {"billing": "money, invoices", "shipping": "delivery", "technical": "bugs",
                          "account": None, "sales": "pricing"}},
    "urgency": {"type": "score", "instructions": "How urgent is the request?",
                "criteria": ["low", "medium", "high", "critical"]},
    "refund": {"type": "noul", "instructions": "Is the customer asking for a refund?"},
}
STATES = ["I would like to cancel my subscription and get my money back as soon as possible.",
          {"role": "user", "content": "The app crashes when I open the settings page."},
          "Le client demande un remboursement parce que la commande est arrivée en retard."]
FILES = ["rl_agent_config.json", "model.safetensors", "encoder/config.json", "tokenizer/tokenizer.json",
         "tokenizer/tokenizer_config.json", "tokenizer/special_tokens_map.json"]


@pytest.fixture(params=["tiny", "tiny-ml", "tiny-par"])
def preset_ckpt(request, tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt):
    return request.param, {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt, "tiny-par": tiny_par_ckpt}[request.param]


# ------------------------------------------------------------------------ upstream loads them

def test_upstream_loads_strictly_and_answers_decisively(preset_ckpt, upstream_agent):
    name, path = preset_ckpt
    agent = upstream_agent(path)
    assert agent.parallel_options == (name == "tiny-par")
    spreads = []
    for state in STATES:
        answers = agent.predict(state, QUESTIONS)["answers"]
        assert set(answers) == set(QUESTIONS)
        probs = list(answers["dept"]["probabilities"].values())
        assert math.isclose(sum(probs), 1.0, abs_tol=1e-3)
        spreads.append(max(probs) - min(probs))
        assert 0.0 <= answers["refund"]["noul"] <= 1.0
        assert 0.0 < answers["dept"]["action"]["act_probability"] < 1.0   # act head not saturated
    # 5 options: uniform is 0.2 each. Random-but-scaled weights must separate options clearly.
    assert min(spreads) > 0.1, spreads


def test_our_reading_matches_upstreams_model(preset_ckpt, upstream_agent):
    _, path = preset_ckpt
    agent = upstream_agent(path)
    ck = open_checkpoint(path)
    net, ecfg = ck.net, agent.model.encoder.config
    assert (net.hidden_size, net.num_layers, net.heads, net.intermediate_size, net.vocab_size) == (
        ecfg.hidden_size, ecfg.num_hidden_layers, ecfg.num_attention_heads, ecfg.intermediate_size,
        ecfg.vocab_size)
    assert net.local_attention == ecfg.local_attention and list(net.layer_types) == list(ecfg.layer_types)
    assert net.sliding_window == ecfg.sliding_window
    assert net.rope_theta == {kind: p["rope_theta"] for kind, p in ecfg.rope_parameters.items()}
    assert net.norm_eps == ecfg.norm_eps
    assert {k: tuple(v.shape) for k, v in agent.model.state_dict().items()} == ck.tensor_shapes
    assert net.head_layers == len(agent.model.head.layers)
    assert net.head_heads == agent.model.head.layers[0].self_attn.num_heads
    assert net.n_act == agent.model.act_head[2].out_features
    tok = agent.tok
    sp = ck.special
    assert (sp.cls, sp.sep, sp.pad, sp.mask) == (tok.cls_token, tok.sep_token, tok.pad_token, tok.mask_token)
    assert (sp.cls_id, sp.sep_id, sp.pad_id, sp.mask_id) == (
        tok.cls_token_id, tok.sep_token_id, tok.pad_token_id, tok.mask_token_id)
    assert (ck.max_len, ck.head_max_len) == (agent.cfg["max_len"], agent.cfg["head_max_len"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # nothing to replace: no warning
        t = Temperatures.from_config(ck.config)
    assert list(t.per_type) == agent.temperature and t.by_options == agent.temperature_by_options


def test_upstream_load_leaves_the_files_unchanged(tiny_ml_ckpt, upstream_agent, tmp_path):
    """Post-patch tokenizer_config.json: upstream's `_fix_tokenizer_config` has nothing to rewrite."""
    copy = str(tmp_path / "c")
    shutil.copytree(tiny_ml_ckpt, copy)
    upstream_agent(copy)
    for rel in FILES:
        assert filecmp.cmp(os.path.join(copy, rel), os.path.join(tiny_ml_ckpt, rel), shallow=False), rel


def test_tokenizer_presets_have_the_real_special_token_conventions(tiny_ckpt, tiny_ml_ckpt):
    en, ml = open_checkpoint(tiny_ckpt).special, open_checkpoint(tiny_ml_ckpt).special
    assert (en.cls, en.sep, en.pad, en.mask) == ("[CLS]", "[SEP]", "[PAD]", "[MASK]")
    assert en.cls_id > 256                                    # after the byte alphabet, as in ModernBERT
    assert (ml.cls, ml.sep, ml.pad, ml.mask) == ("<bos>", "<eos>", "<pad>", "<mask>")
    assert (ml.cls_id, ml.sep_id, ml.pad_id, ml.mask_id) == (2, 1, 0, 4)


def test_files_modes_and_layout(tiny_ckpt):
    for rel in FILES:
        assert os.stat(os.path.join(tiny_ckpt, rel)).st_mode & 0o777 == 0o644, rel
    for d in ("", "encoder", "tokenizer"):
        assert os.stat(os.path.join(tiny_ckpt, d)).st_mode & 0o777 == 0o755
    cfg = json.load(open(os.path.join(tiny_ckpt, "rl_agent_config.json")))
    assert len(cfg["act_costs"]) == 1 and cfg["amp_dtype"] == "bf16" and cfg["head_layers"] == 2
    assert json.load(open(os.path.join(tiny_ckpt, "encoder", "config.json")))["dtype"] == "float32"
    weights = load_file(os.path.join(tiny_ckpt, "model.safetensors"))
    assert {w.dtype for w in weights.values()} == {np.dtype("float16")}
    assert weights["temperature"].tolist() == [1.0, 1.0, 1.0]


# ------------------------------------------------------------------------ determinism, CLI

def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_ckpt):
    again = make_checkpoint(str(tmp_path / "again"), "tiny", seed=0)
    for rel in FILES:
        assert filecmp.cmp(os.path.join(again, rel), os.path.join(tiny_ckpt, rel), shallow=False), rel
    other = make_checkpoint(str(tmp_path / "other"), "tiny", seed=1)
    a = load_file(os.path.join(tiny_ckpt, "model.safetensors"))
    b = load_file(os.path.join(other, "model.safetensors"))
    assert not np.array_equal(a["scorer.1.weight"], b["scorer.1.weight"])
    assert filecmp.cmp(os.path.join(other, "tokenizer/tokenizer.json"),
                       os.path.join(tiny_ckpt, "tokenizer/tokenizer.json"), shallow=False)


def test_cli_writes_refuses_to_overwrite_and_forces(tmp_path, capsys):
    target = str(tmp_path / "cli")
    assert cli.main(["make-checkpoint", target, "--preset", "tiny", "--option-layout", "parallel"]) == 0
    assert open_checkpoint(target).option_layout == "parallel"
    assert cli.main(["make-checkpoint", target, "--preset", "tiny-ml"]) == 2
    assert "exists" in capsys.readouterr().err
    assert open_checkpoint(target).special.cls == "[CLS]"          # untouched
    assert cli.main(["make-checkpoint", target, "--preset", "tiny-ml", "--force", "--seed", "3"]) == 0
    assert open_checkpoint(target).special.cls == "<bos>"
    assert not [n for n in os.listdir(tmp_path) if ".tmp-" in n]


# ------------------------------------------------------------------------ big presets, by table

@pytest.mark.parametrize("preset,params", [("large", 421_293_827), ("ml-base", 321_908_995)])
def test_big_preset_shapes_match_the_published_models(preset, params):
    p = PRESETS[preset]
    shapes = tensor_shapes(Dims(vocab_size=p.vocab_size, hidden_size=p.hidden_size, num_layers=p.num_layers,
                                intermediate_size=p.intermediate_size, head_layers=2, n_act=2))
    assert parameter_count(shapes) == params
    if preset == "large":
        assert len(shapes) == 206
        assert shapes["encoder.layers.27.mlp.Wi.weight"] == (5248, 1024)
        assert "encoder.layers.0.attn_norm.weight" not in shapes
    else:
        assert shapes["act_head.0.weight"] == (256, 772)


# ------------------------------------------------------------------------ validation errors

def _edit_json(rel, fn):
    def apply(root):
        path = os.path.join(root, rel)
        obj = json.load(open(path))
        fn(obj)
        with open(path, "w") as f:
            json.dump(obj, f)
    return apply


def _write(rel, text):
    def apply(root):
        with open(os.path.join(root, rel), "w") as f:
            f.write(text)
    return apply


def _remove(rel):
    return lambda root: os.remove(os.path.join(root, rel))


def _edit_tensors(fn):
    def apply(root):
        path = os.path.join(root, "model.safetensors")
        t = load_file(path)
        fn(t)
        save_file(t, path)
    return apply


CORRUPTIONS = [
    ("no_config", _remove("rl_agent_config.json"), "rl_agent_config.json", "missing"),
    ("no_weights", _remove("model.safetensors"), "model.safetensors", "missing"),
    ("no_encoder_config", _remove("encoder/config.json"), "encoder/config.json", "missing"),
    ("no_tokenizer", _remove("tokenizer/tokenizer.json"), "tokenizer/tokenizer.json", "missing"),
    ("no_tokenizer_config", _remove("tokenizer/tokenizer_config.json"), "tokenizer/tokenizer_config.json",
     "missing"),
    ("config_not_json", _write("rl_agent_config.json", "{not json"), "rl_agent_config.json", "invalid JSON"),
    ("config_not_object", _write("rl_agent_config.json", "[1, 2]"), "rl_agent_config.json", "JSON object"),
    ("encoder_not_json", _write("encoder/config.json", ""), "encoder/config.json", "invalid JSON"),
    ("tokenizer_not_json", _write("tokenizer/tokenizer.json", "{"), "tokenizer/tokenizer.json", "invalid JSON"),
    ("no_encoder_key", _edit_json("rl_agent_config.json", lambda c: c.pop("encoder")),
     "rl_agent_config.json", "'encoder'"),
    ("no_head_layers", _edit_json("rl_agent_config.json", lambda c: c.pop("head_layers")),
     "rl_agent_config.json", "'head_layers'"),
    ("temperature_len", _edit_json("rl_agent_config.json", lambda c: c.update(temperature=[1.0, 1.0])),
     "rl_agent_config.json", "list of 3"),
    ("temperature_scalar", _edit_json("rl_agent_config.json", lambda c: c.update(temperature=1.0)),
     "rl_agent_config.json", "list of 3"),
    ("tbo_not_mapping", _edit_json("rl_agent_config.json", lambda c: c.update(temperature_by_options=[1])),
     "rl_agent_config.json", "temperature_by_options"),
    ("layout", _edit_json("rl_agent_config.json", lambda c: c.update(option_layout="diagonal")),
     "rl_agent_config.json", "option_layout"),
    ("max_len_zero", _edit_json("rl_agent_config.json", lambda c: c.update(max_len=0)),
     "rl_agent_config.json", "'max_len'"),
    ("head_max_len_str", _edit_json("rl_agent_config.json", lambda c: c.update(head_max_len="192")),
     "rl_agent_config.json", "'head_max_len'"),
    ("head_layers_bool", _edit_json("rl_agent_config.json", lambda c: c.update(head_layers=True)),
     "rl_agent_config.json", "'head_layers'"),
    ("model_type", _edit_json("encoder/config.json", lambda c: c.update(model_type="bert")),
     "encoder/config.json", "modernbert"),
    ("heads_divide", _edit_json("encoder/config.json", lambda c: c.update(num_attention_heads=5)),
     "encoder/config.json", "divisible"),
    ("layer_types", _edit_json("encoder/config.json", lambda c: c.update(layer_types=["full_attention"])),
     "encoder/config.json", "layer_types"),
    ("rope_theta", _edit_json("encoder/config.json",
                              lambda c: c["rope_parameters"]["sliding_attention"].update(rope_theta=-1)),
     "encoder/config.json", "rope_theta"),
    ("rope_not_per_layer_type", _edit_json("encoder/config.json", lambda c: c.update(rope_parameters={"rope_theta": 1e4})),
     "encoder/config.json", "'rope_parameters' must map"),
    ("rope_type", _edit_json("encoder/config.json",
                             lambda c: c["rope_parameters"]["full_attention"].update(rope_type="linear")),
     "encoder/config.json", "rope_type 'linear'"),
    ("attention_bias", _edit_json("encoder/config.json", lambda c: c.update(attention_bias=True)),
     "encoder/config.json", "attention_bias=True is not supported"),
    ("encoder_dtype", _edit_json("encoder/config.json", lambda c: c.update(dtype="float64")),
     "encoder/config.json", "dtype 'float64' is not supported"),
    ("vocab_mismatch", _edit_json("encoder/config.json", lambda c: c.update(vocab_size=c["vocab_size"] + 64)),
     "model.safetensors", "encoder.embeddings.tok_embeddings.weight: expected"),
    ("hidden_mismatch", _edit_json("encoder/config.json", lambda c: c.update(intermediate_size=128)),
     "model.safetensors", "wrong shape"),
    ("layers_mismatch", _edit_json("encoder/config.json",
                                   lambda c: c.update(num_hidden_layers=5, layer_types=c["layer_types"] + ["full_attention"])),
     "model.safetensors", "missing tensor"),
    ("n_act_mismatch", _edit_json("rl_agent_config.json", lambda c: c["act_costs"].update(other=1.0)),
     "model.safetensors", "act_head.2.weight"),
    ("head_layers_mismatch", _edit_json("rl_agent_config.json", lambda c: c.update(head_layers=1)),
     "model.safetensors", "unexpected tensor"),
    ("tensor_missing", _edit_tensors(lambda t: t.pop("scorer.3.bias")), "model.safetensors", "scorer.3.bias"),
    ("buffer_missing", _edit_tensors(lambda t: t.pop("temperature")), "model.safetensors", "temperature"),
    ("tensor_extra", _edit_tensors(lambda t: t.update(extra=np.zeros(2, np.float16))), "model.safetensors",
     "unexpected tensor(s): extra"),
    ("tensor_shape", _edit_tensors(lambda t: t.update({"type_emb.weight": np.zeros((4, 64), np.float16)})),
     "model.safetensors", "type_emb.weight: expected [3, 64], found [4, 64]"),
    ("weights_garbage", _write("model.safetensors", "garbage"), "model.safetensors", "safetensors"),
    ("mask_token_missing", lambda root: (_edit_json("tokenizer/tokenizer_config.json", lambda c: c.pop("mask_token"))(root),
                                         _remove("tokenizer/special_tokens_map.json")(root)),
     "tokenizer/tokenizer_config.json", "mask_token"),
    ("cls_token_unknown", _edit_json("tokenizer/tokenizer_config.json", lambda c: c.update(cls_token="[NOPE]")),
     "tokenizer/tokenizer.json", "cls_token"),
]


@pytest.mark.parametrize("name,corrupt,rel,problem", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_each_defect_is_a_checkpoint_error_naming_the_file(tiny_ckpt, tmp_path, name, corrupt, rel, problem):
    root = str(tmp_path / "bad")
    shutil.copytree(tiny_ckpt, root)
    corrupt(root)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(root)
    err = info.value
    assert err.path == os.path.join(root, rel)
    assert problem in err.problem
    assert err.kind is Kind.CHECKPOINT and err.detail.startswith(err.path + ": ")


def test_mask_token_from_special_tokens_map_when_config_lacks_it(tiny_ckpt, tmp_path):
    """transformers falls back to special_tokens_map.json; so do we."""
    root = str(tmp_path / "c")
    shutil.copytree(tiny_ckpt, root)
    _edit_json("tokenizer/tokenizer_config.json", lambda c: c.pop("mask_token"))(root)
    assert open_checkpoint(root).special.mask == "[MASK]"


def test_legacy_rope_keys_and_missing_layer_types(tiny_ml_ckpt, tmp_path):
    root = str(tmp_path / "c")
    shutil.copytree(tiny_ml_ckpt, root)

    def legacy(c):
        c.pop("rope_parameters"), c.pop("layer_types")
        c.update(global_rope_theta=160000.0, local_rope_theta=160000.0, global_attn_every_n_layers=3)
    _edit_json("encoder/config.json", legacy)(root)
    ck = open_checkpoint(root)
    assert ck.net.rope_theta == {"full_attention": 160000.0, "sliding_attention": 160000.0}
    assert ck.net.layer_types == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")


def test_rope_thetas_default_as_transformers_does(tiny_ckpt, tmp_path):
    """No theta anywhere: ModernBertConfig.default_theta per layer type; a legacy key wins over it."""
    from transformers import ModernBertConfig
    root = str(tmp_path / "c")
    shutil.copytree(tiny_ckpt, root)

    def drop(c):
        c.pop("rope_parameters"), c.update(local_rope_theta=5000.0)
    _edit_json("encoder/config.json", drop)(root)
    with open(os.path.join(root, "encoder", "config.json")) as f:
        expected = ModernBertConfig(**json.load(f)).rope_parameters
    assert open_checkpoint(root).net.rope_theta == {k: p["rope_theta"] for k, p in expected.items()} == {
        "full_attention": 160000.0, "sliding_attention": 5000.0}


# ------------------------------------------------------------------------ sources

def test_missing_paths_are_errors_not_hub_lookups(tmp_path):
    for source in (str(tmp_path / "nope"), "./nope", "../nope", "not a hub id"):
        with pytest.raises(CheckpointError, match="no such checkpoint directory"):
            open_checkpoint(source)


def test_local_path_with_revision_is_refused(tiny_ckpt):
    with pytest.raises(CheckpointError, match="revision"):
        open_checkpoint(tiny_ckpt, revision="main")


def test_hub_source_downloads_only_the_checkpoint_files(tiny_ml_ckpt, tmp_path, monkeypatch):
    """`convaiinnovations/laya` + subfolder + revision: the call upstream makes, and the snapshot sha."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    sha = PINNED_REVISIONS["convaiinnovations/laya"]
    snapshot = tmp_path / "models--convaiinnovations--laya" / "snapshots" / sha
    shutil.copytree(tiny_ml_ckpt, str(snapshot / "multilingual"))
    calls = []

    def fake_snapshot_download(repo_id, **kw):   # no network in tests: stands in for the hub only
        calls.append((repo_id, kw))
        return str(snapshot)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    ck = open_checkpoint("convaiinnovations/laya", revision="reviewed", subfolder="multilingual")
    assert calls == [("convaiinnovations/laya", {
        "allow_patterns": ["multilingual/rl_agent_config.json", "multilingual/model.safetensors",
                           "multilingual/tokenizer/*", "multilingual/encoder/*"],
        "revision": sha})]
    assert ck.revision == sha and ck.source == "convaiinnovations/laya"
    assert ck.path == str(snapshot / "multilingual") and ck.special.cls == "<bos>"
    with pytest.raises(CheckpointError, match="subfolder 'typed-decisions' not found"):
        open_checkpoint("convaiinnovations/laya", subfolder="typed-decisions")
    with pytest.raises(CheckpointError, match="no reviewed commit"):
        open_checkpoint("someone/else", revision="reviewed")


def test_hub_failure_is_a_checkpoint_error(monkeypatch):
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def offline(repo_id, **kw):
        raise OSError("We couldn't connect to 'https://huggingface.co'")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(CheckpointError, match="could not fetch from the Hugging Face hub at revision abc: OSError"):
        open_checkpoint("convaiinnovations/laya", revision="abc")


# ------------------------------------------------------------------------ temperatures, digest

RAW_TEMPERATURES = [0.1006, 99, 1.3, True, False, "x", None, float("nan"), float("inf"), "2.5", 0, 5.0, 0.5]


def test_clamp_is_upstreams():
    from laya.common import clamp_temperature as up_clamp, temperature_rejected as up_rejected
    for t in RAW_TEMPERATURES:
        assert clamp_temperature(t) == up_clamp(t), t
        assert temperature_rejected(t, clamp_temperature(t)) == up_rejected(t, up_clamp(t)), t


def test_clamped_checkpoint_temperatures_and_warning_match_upstream(tiny_ckpt, tmp_path, upstream_agent):
    root = str(tmp_path / "c")
    shutil.copytree(tiny_ckpt, root)
    _edit_json("rl_agent_config.json", lambda c: (c["temperature_by_options"].update({"choice:11+": 0.1006}),
                                                  c.update(temperature=[1.0, 9.0, 1.0])))(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import laya
        agent = laya.load(root, device="cpu")
    up_warning = [str(w.message) for w in caught if "invalid temperatures" in str(w.message)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Temperatures.from_config(open_checkpoint(root).config)
    our_warning = [str(w.message) for w in caught]
    assert [w.category for w in caught] == [RuntimeWarning]
    assert list(t.per_type) == agent.temperature and t.by_options == agent.temperature_by_options
    assert "; using choice:11+=0.1006 -> 0.5, temperature[1]=9.0 -> 5. Treat" in our_warning[0]
    assert up_warning == our_warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Temperatures.from_config({"temperature": [1, 1, 1]})


def test_sha256_is_the_file_digest_and_cached(tiny_ckpt):
    import hashlib
    ck = open_checkpoint(tiny_ckpt)
    want = hashlib.sha256(open(ck.weights_path, "rb").read()).hexdigest()
    assert ck.sha256 == want
    assert open_checkpoint(tiny_ckpt).sha256 == want
