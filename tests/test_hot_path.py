"""The serving hot path's shortcuts give exactly what the general code gives.

PackedRows (contiguous take, validation, small-batch padding), the gRPC answer packing (no JSON
round trip), the surrogate pre-check and the Infer coalescer's direct call are each compared with
the slow, obviously-right form they replace.
"""
import asyncio
import json

import numpy as np
import pytest

from laya_grpc.engine.coalesce import InferCoalescer
from laya_grpc.gateway.http_body import may_hold_lone_surrogate, load_json
from laya_grpc.client.answers import response_dict
from laya_grpc.gateway.typed_answer import pack_decision
from laya_grpc.gateway.render import render_json
from laya_grpc.core.decisions.answers import Decision, Usage
from laya_grpc.core.decisions.controls import has_lone_surrogate
from laya_grpc.core.decisions.decode import decode_answer
from laya_grpc.core.errors import LayaError
from laya_grpc.core.decisions.langdetect import analyse
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.core.decisions.routing import Routing
from laya_grpc.core.decisions.temperatures import Temperatures
from laya_proto.v1 import decision_pb2

I32 = np.dtype("<i4")


def _rows(rng, n, parallel=False):
    lens = rng.integers(1, 9, n)
    mc = np.minimum(rng.integers(0, 4, n), lens)
    ro = np.concatenate([[0], np.cumsum(lens)]).astype(I32)
    mo = np.concatenate([[0], np.cumsum(mc)]).astype(I32)
    ids = rng.integers(0, 50, int(ro[-1])).astype(I32)
    mk = (np.concatenate([rng.integers(0, l, c) for l, c in zip(lens, mc)]) if n else np.zeros(0)).astype(I32)
    extra = {}
    if parallel:
        extra = {"position_ids": rng.integers(0, 99, len(ids)).astype(I32),
                 "option_ids": rng.integers(0, 9, len(ids)).astype(I32)}
    return PackedRows(ids=ids, row_offsets=ro, markers=mk, marker_offsets=mo,
                      qtypes=rng.integers(0, 3, n).astype(I32), fingerprint="f", **extra)


def _gathered(rows, index):
    """take() by explicit gather (what a non-range index does)."""
    return rows.take(list(index))


def _same(a, b):
    for f in ("ids", "row_offsets", "markers", "marker_offsets", "qtypes", "position_ids", "option_ids"):
        x, y = getattr(a, f), getattr(b, f)
        assert (x is None) == (y is None), f
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), f
    assert a.fingerprint == b.fingerprint


def _scatter_pad(rows, pad_id, pad_to=None, rows_to=None, markers_to=None):
    """The vectorised padding, written out: the reference for the row-by-row small-batch path."""
    n, lens, mc = rows.n, rows.lengths, rows.marker_counts
    L = max(int(lens.max()) if n else 1, pad_to or 0)
    K = max(int(mc.max()) if n else 1, markers_to or 0, 1)
    N = max(n, rows_to or 0)
    out = {"input_ids": np.full((N, L), pad_id, np.int64), "attention_mask": np.zeros((N, L), np.int64),
           "marker_pos": np.zeros((N, K), np.int64), "marker_mask": np.zeros((N, K), bool),
           "qtype": np.zeros((N,), np.int64)}
    out["qtype"][:n] = rows.qtypes
    for i in range(n):
        a, b = rows.row_offsets[i], rows.row_offsets[i + 1]
        c, d = rows.marker_offsets[i], rows.marker_offsets[i + 1]
        out["input_ids"][i, : b - a] = rows.ids[a:b]
        out["attention_mask"][i, : b - a] = 1
        out["marker_pos"][i, : d - c] = rows.markers[c:d]
        out["marker_mask"][i, : d - c] = True
    if rows.position_ids is not None:
        out["position_ids"] = np.zeros((N, L), np.int64)
        out["option_ids"] = np.zeros((N, L), np.int64)
        for i in range(n):
            a, b = rows.row_offsets[i], rows.row_offsets[i + 1]
            out["position_ids"][i, : b - a] = rows.position_ids[a:b]
            out["option_ids"][i, : b - a] = rows.option_ids[a:b]
    return out


@pytest.mark.parametrize("parallel", [False, True])
def test_contiguous_take_matches_gather(parallel):
    rng = np.random.default_rng(0)
    for n in range(0, 7):
        rows = _rows(rng, n, parallel)
        rows.validate()
        for a in range(n + 1):
            for b in range(a, n + 1):
                _same(rows.take(range(a, b)), _gathered(rows, range(a, b)))
                rows.take(range(a, b)).validate()
        assert rows.take(range(0, n)) is rows


@pytest.mark.parametrize("parallel", [False, True])
def test_padding_matches_the_scatter_form(parallel):
    rng = np.random.default_rng(1)
    for n in list(range(0, 12)) + [40]:
        rows = _rows(rng, n, parallel)
        for kw in ({}, {"pad_to": 16}, {"rows_to": 16, "markers_to": 5}, {"rows_to": 2}):
            got, want = rows.pad(3, **kw), _scatter_pad(rows, 3, **kw)
            assert got.keys() == want.keys()
            for k in want:
                assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), (n, kw, k)


@pytest.mark.parametrize("change, detail", [
    (dict(row_offsets=[0, 3]), "row_offsets must have n_rows+1 non-decreasing entries from 0 to 5"),
    (dict(row_offsets=[0, 6, 5]), "row_offsets must have n_rows+1 non-decreasing entries from 0 to 5"),
    (dict(row_offsets=[0, 0, 5]), "empty row"),
    (dict(marker_offsets=[0, 2, 1]), "marker_offsets must have n_rows+1 non-decreasing entries from 0 to 1"),
    (dict(qtypes=[0, 3]), "qtype must be 0 (choice), 1 (score) or 2 (noul)"),
    (dict(ids=[1, 2, 3, 4, 60]), "token id outside the vocabulary (0..49)"),
    (dict(ids=[1, 2, -3, 4, 5]), "token id outside the vocabulary (0..49)"),
    (dict(markers=[2], marker_offsets=[0, 0, 1]), "marker position outside its row"),
    (dict(markers=[-1]), "marker position outside its row"),
    (dict(position_ids=[0, 1]), "position_ids must have one entry per token"),
])
def test_validation_errors_are_unchanged(change, detail):
    base = dict(ids=[1, 2, 3, 4, 5], row_offsets=[0, 3, 5], markers=[1], marker_offsets=[0, 1, 1], qtypes=[0, 2])
    base.update(change)
    kw = {k: np.asarray(v, I32) for k, v in base.items()}
    if "position_ids" in kw:
        kw["option_ids"] = kw["position_ids"]
    with pytest.raises(LayaError) as e:
        PackedRows(**kw).validate(vocab_size=50)
    assert e.value.detail == "token rows: " + detail


def test_max_len_check_alone_says_what_validate_says():
    rows = PackedRows(ids=np.arange(7, dtype=I32), row_offsets=np.asarray([0, 2, 7], I32),
                      markers=np.asarray([1], I32), marker_offsets=np.asarray([0, 1, 1], I32),
                      qtypes=np.asarray([0, 1], I32))
    rows.check_max_len(5 + 2)
    with pytest.raises(LayaError) as full:
        rows.validate(max_len=4)
    with pytest.raises(LayaError) as alone:
        rows.check_max_len(4)
    assert alone.value.detail == full.value.detail and "a row of 5 tokens" in alone.value.detail


@pytest.mark.parametrize("criteria", [[1, "1", 2.5, "2.5", "x"], [True, "true", 7], [False, "false", 0.1],
                                      [1.0e16, -0.0, 3], {"refund": "money", "x": {"k": [1, 2]}}])
@pytest.mark.parametrize("strict", [False, True], ids=["serve", "jev-strict"])
def test_typed_answer_is_the_http_body(criteria, strict):
    """The typed answer packed without JSON, read back as the client does, is json.loads of the
    rendered HTTP body, key order included (every answer type, gate on and off, Jev-strict)."""
    rng = np.random.default_rng(2)
    qs = parse_questions({"c": {"type": "choice", "instructions": "x", "criteria": criteria},
                          "s": {"type": "score", "instructions": "y", "criteria": ["lo", {"a": 1}, "hi"]},
                          "n": {"type": "noul", "instructions": "z"}})
    for gate in (None, 0.5, {"choice:3-5": 0.9, "default": 0.2}):
        for rep in range(5):
            answers = tuple(decode_answer(q, rng.normal(size=len(q.options)).astype(np.float32) * 3,
                                          rng.normal(size=2).astype(np.float32), Temperatures.from_config({}), gate)
                            for q in qs)
            usage = Usage(5, 0, 3, rep, bool(rep % 2), ("c",) if rep % 2 else ())
            routing = Routing(model="english", repo=None if rep % 3 == 0 else "/x", reason="r",
                              detection=None if rep == 4 else analyse(["hello there", "bonjour à tous"][rep % 2]),
                              workflow=None if rep % 2 else "wf")
            decision = Decision(answers, usage, routing, strict)
            got = decision_pb2.DecideResponse()
            pack_decision(decision, got)
            want = json.loads(render_json(decision.body()))
            assert json.dumps(response_dict(got)) == json.dumps(want)
            assert all(a.WhichOneof("answer") == decision_pb2.QuestionType.Name(a.type)[len("QUESTION_TYPE_"):].lower()
                       for a in got.answers)


@pytest.mark.parametrize("raw", [b'{"a": "plain"}', b'{"a": "\\ud800"}', b'{"a": "\\\\ud800"}',
                                 '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),
                                 '{"a": "\ud800"}'.encode("utf-16", "surrogatepass"),
                                 '{"a": "\ud800"}'.encode("utf-32-le", "surrogatepass"),
                                 '{"a": "caf\u00e9"}'.encode("utf-8"), b'{"\\udc00": 1}'])
def test_surrogate_precheck_never_hides_one(raw):
    found = has_lone_surrogate(load_json(raw))
    assert may_hold_lone_surrogate(raw) or not found


def test_coalescer_calls_directly_when_idle_and_shares_under_load():
    calls = []

    async def call(checkpoint, rows):
        calls.append(rows.n)
        await asyncio.sleep(0.01)
        return ("resp", rows.n)

    def one_row():
        return PackedRows(ids=np.asarray([1, 2], I32), row_offsets=np.asarray([0, 2], I32),
                          markers=np.asarray([1], I32), marker_offsets=np.asarray([0, 1], I32),
                          qtypes=np.asarray([2], I32))

    async def go():
        co = InferCoalescer(call, max_inflight=2)
        alone = await co.submit("c", one_row())
        many = await asyncio.gather(*[co.submit("c", one_row()) for _ in range(8)])
        return alone, many
    alone, many = asyncio.run(go())
    assert alone[0] == ("resp", 1) and alone[2] == 0
    assert calls[0] == 1 and sum(calls[1:]) == 8 and len(calls) < 1 + 8   # the 8 shared calls
    for resp, merged, start in many:
        assert resp[1] == merged.n and 0 <= start < merged.n
