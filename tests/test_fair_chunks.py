"""The gateway's fair scheduling without processes: a large request's rows go to inference as
chunks of bounded tokens, one at a time, so a small request sent meanwhile is called before the
large one's next chunk; a cancelled large request sends no further chunk; the chunks' answers
join back into exactly what one call would have answered."""
from __future__ import annotations

import asyncio

import numpy as np

from laya_grpc.core.packed_rows import PackedRows
from laya_grpc.engine.coalesce import InferCoalescer, join_responses, split_rows
from laya_proto.v1 import inference_pb2

I32 = np.int32


def rows_of(lengths, markers=2) -> PackedRows:
    lengths = np.asarray(lengths, I32)
    ids = np.concatenate([np.arange(1, n + 1, dtype=I32) for n in lengths])
    off = np.concatenate([[0], np.cumsum(lengths)]).astype(I32)
    mk = np.ones(markers * len(lengths), I32)
    moff = (np.arange(len(lengths) + 1) * markers).astype(I32)
    return PackedRows(ids=ids, row_offsets=off, markers=mk, marker_offsets=moff, qtypes=np.zeros(len(lengths), I32))


def fake_response(rows: PackedRows, n_act: int = 3) -> inference_pb2.InferResponse:
    """Each row's logits and act logits are its position in `rows` plus 1000 x its length, so a
    row answered from the wrong place shows."""
    tag = np.arange(rows.n, dtype=np.float32) + 1000 * rows.lengths.astype(np.float32)
    logits = np.concatenate([np.full(int(c), t, np.float32) for c, t in zip(rows.marker_counts, tag)])
    act = np.repeat(tag[:, None], n_act, axis=1)
    return inference_pb2.InferResponse(logits=logits.astype("<f4").tobytes(), act_logits=act.astype("<f4").tobytes(),
                                       n_act=n_act, device="cpu", dtype="float32")


def test_split_rows_bounds_tokens_and_keeps_every_row_in_order():
    rows = rows_of([5, 7, 3, 9, 2, 40, 1])
    chunks = split_rows(rows, 12)
    assert [c.n for c in chunks] == [2, 2, 1, 1, 1]   # 5+7 | 3+9 | 2 | 40 (alone: longer than the bound) | 1
    assert np.array_equal(np.concatenate([c.lengths for c in chunks]), rows.lengths)
    assert all(int(c.lengths.sum()) <= 12 or c.n == 1 for c in chunks)
    assert split_rows(rows, 10_000) == [rows]


def test_joined_chunks_answer_as_one_call():
    rows = rows_of([4, 6, 8, 3, 5], markers=3)
    parts, expected_logits, expected_act = [], [], []
    for chunk in split_rows(rows, 10):
        merged = PackedRows.concat([rows_of([2]), chunk])   # shared with another request's row first
        resp = fake_response(merged)
        parts.append((resp, merged, 1, chunk.n))
        lg = np.frombuffer(resp.logits, "<f4")
        expected_logits.append(lg[int(merged.marker_offsets[1]):])
        expected_act.append(np.frombuffer(resp.act_logits, "<f4").reshape(merged.n, 3)[1:])
    joined = join_responses(parts, rows)
    assert np.array_equal(np.frombuffer(joined.logits, "<f4"), np.concatenate(expected_logits))
    assert np.array_equal(np.frombuffer(joined.act_logits, "<f4").reshape(rows.n, 3), np.concatenate(expected_act))
    assert len(np.frombuffer(joined.logits, "<f4")) == int(rows.marker_counts.sum()) and joined.n_act == 3


def test_small_request_goes_before_the_large_requests_next_chunk():
    calls = []

    async def call(checkpoint, rows):
        calls.append(rows.n)
        await asyncio.sleep(0.02)
        return fake_response(rows)   # no model_ms: the chunk size stays the first one

    async def go():
        co = InferCoalescer(call, first_chunk_tokens=10)
        large = asyncio.ensure_future(co.submit("c", rows_of([5] * 40)))   # 20 chunks of 2 rows
        await asyncio.sleep(0.03)   # its second chunk is running
        small = await co.submit("c", rows_of([3]))
        chunks_before_small = calls.index(1)
        resp, merged, start = await large
        return chunks_before_small, resp, merged
    before, resp, merged = asyncio.run(go())
    assert before <= 2, before            # before: all 20 chunks' rows went ahead of it in one call
    assert merged.n == 40 and len(resp.act_logits) == 40 * 3 * 4


def test_cancelled_large_request_sends_no_further_chunk():
    calls = []

    async def call(checkpoint, rows):
        calls.append(rows.n)
        await asyncio.sleep(0.02)
        return fake_response(rows)

    async def go():
        co = InferCoalescer(call, first_chunk_tokens=10)
        large = asyncio.ensure_future(co.submit("c", rows_of([5] * 40)))
        await asyncio.sleep(0.05)
        large.cancel()
        sent = len(calls)
        await asyncio.sleep(0.1)
        return sent, len(calls)
    sent, later = asyncio.run(go())
    assert sent == later and sent < 5, (sent, later)


def test_chunk_size_follows_the_measured_device_speed():
    sizes = []

    async def call(checkpoint, rows):
        sizes.append(int(rows.lengths.sum()))
        resp = fake_response(rows)
        resp.model_ms, resp.batch_rows = 0.5 * float(rows.lengths.sum()), rows.n   # 0.5 ms a token
        return resp

    async def go():
        co = InferCoalescer(call, chunk_ms=50.0, first_chunk_tokens=400)
        resp, merged, _ = await co.submit("c", rows_of([10] * 100))
        return co, resp, merged
    co, resp, merged = asyncio.run(go())
    assert sizes == [400, 250, 250, 100], sizes   # 50 ms / 0.5 ms = 100 tokens -> the 256 floor, in whole rows
    assert co.chunk_tokens("c") == 256 and merged.n == 100
