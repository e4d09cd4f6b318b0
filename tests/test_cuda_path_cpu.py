"""The CUDA path's shape logic, run on CPU (CI has no GPU): bucket choice, padding into reused
buffers, the bounded graph cache, the batcher's bucket-aware budget, and that
bucket padding leaves the real rows' outputs unchanged (CPU fp32 network, padding queries past the
sliding window included)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from laya_grpc.inference.cuda_graphs import Bucket, BucketPlan, GraphCache, field_sizes, field_views, fill_bucket
from laya_grpc.core.errors import LayaError
from laya_grpc.inference.registry import synthetic_rows


def test_bucket_rounds_up_rows_tokens_markers():
    plan = BucketPlan(max_rows=256, max_tokens=512)
    assert plan.bucket(1, 119, 3) == Bucket(1, 128, 8)
    assert plan.bucket(3, 132, 9) == Bucket(4, 160, 16)
    assert plan.bucket(70, 10, 2) == Bucket(128, 16, 8)
    assert plan.bucket(256, 512, 1) == Bucket(256, 512, 8)
    assert BucketPlan(max_rows=100, max_tokens=300).bucket(100, 290, 1) == Bucket(100, 300, 8)
    with pytest.raises(LayaError, match="exceeds the graph plan"):
        plan.bucket(257, 10, 1)
    with pytest.raises(LayaError, match="exceeds the graph plan"):
        plan.bucket(1, 513, 1)


def test_warm_set_covers_every_batch_within_the_budget():
    """Whatever the batcher forms under its padded-token budget lands in a captured bucket."""
    plan, budget = BucketPlan(max_rows=256, max_tokens=512), 16384
    warm = set(plan.warm_buckets(budget))
    rng = np.random.default_rng(0)
    for _ in range(3000):
        rows, tokens = int(rng.integers(1, 257)), int(rng.integers(1, 513))
        b = plan.bucket(rows, tokens, 1)
        if b.rows * b.tokens <= budget or rows == 1:
            assert b in warm, (rows, tokens, b)
    assert len(warm) <= 96   # the runner's default cache capacity: nothing is evicted at ready


def test_fill_bucket_writes_every_element_and_pads_safely():
    b = Bucket(4, 32, 8)
    flat = np.full(sum(field_sizes(b, False).values()), 777, dtype=np.int64)   # poison
    views = field_views(flat, b, False)
    batch = synthetic_rows(3, 20, 5, vocab=100, seed=1).pad(0)
    assert fill_bucket(views, batch, b) == 3
    assert not (flat == 777).any()
    assert (views["input_ids"][:3, :20] == batch["input_ids"]).all() and (views["input_ids"][:, 20:] == 0).all()
    assert (views["attention_mask"][:3, 20:] == 0).all()
    assert (views["attention_mask"][3:, 0] == 1).all() and views["attention_mask"][3:, 1:].sum() == 0
    assert (views["marker_mask"][:3, :5] == 1).all() and views["marker_mask"][:, 5:].sum() == 0
    with pytest.raises(LayaError, match="does not fit"):
        fill_bucket(views, synthetic_rows(5, 20, 2, vocab=100).pad(0), b)


def test_graph_cache_is_lru_and_bounded():
    made, freed = [], []
    cache = GraphCache(2, capture=lambda k: made.append(k) or ("g", k), release=freed.append)
    cache.get("a"), cache.get("b"), cache.get("a"), cache.get("c")
    assert made == ["a", "b", "c"] and freed == [("g", "b")] and cache.keys() == ["a", "c"]
    assert (cache.hits, cache.captures, cache.evictions) == (1, 3, 1)
    cache.clear()
    assert len(cache) == 0 and len(freed) == 3


def test_graph_cache_takes_an_entry_built_elsewhere():
    """The warm-up builds every bucket's buffers before it captures any (cuda_graphs.warm_graphs):
    `get` with a capture of its own builds a missing key that way, counted and bounded like any."""
    cache = GraphCache(2, capture=lambda k: ("default", k))
    assert "a" not in cache
    assert cache.get("a", lambda k: ("warm", k)) == ("warm", "a") and "a" in cache
    assert cache.get("a", lambda k: ("again", k)) == ("warm", "a")   # present: not built again
    cache.get("b"), cache.get("c", lambda k: ("warm", k))
    assert cache.keys() == ["b", "c"] and (cache.hits, cache.captures, cache.evictions) == (1, 3, 1)


@pytest.mark.parametrize("which", ["tiny_ckpt", "tiny_par_ckpt"])
def test_bucket_padding_is_exact_for_real_rows(which, request):
    """Extra rows, token columns (padding queries far past tiny's 16-token window) and marker slots
    change nothing in the real rows' outputs on the CPU fp32 network."""
    torch = pytest.importorskip("torch")
    from laya_grpc.inference.torch_model import LayaTorch
    ckpt = request.getfixturevalue(which)
    model = LayaTorch.from_checkpoint(ckpt)
    rows = synthetic_rows(3, 40, 4, vocab=model.spec.vocab_size, seed=2)
    rows.row_offsets = np.array([0, 40, 70, 120], dtype=np.int32)  # ragged: 40, 30, 50 tokens
    if which == "tiny_par_ckpt":
        rows.position_ids = np.concatenate([np.arange(n, dtype=np.int32) for n in (40, 30, 50)])
        rows.option_ids = np.zeros_like(rows.ids)
    batch = rows.pad(0)
    b = BucketPlan(max_rows=8, max_tokens=512).bucket(3, 50, 4)
    flat = np.zeros(sum(field_sizes(b, rows.position_ids is not None).values()), dtype=np.int64)
    views = field_views(flat, b, rows.position_ids is not None)
    fill_bucket(views, batch, b)

    def run(d):
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in d.items()}
        with torch.inference_mode():
            return model(t["input_ids"], t["attention_mask"], t["marker_pos"], t["marker_mask"], t["qtype"],
                         t.get("position_ids"), t.get("option_ids"))
    (l0, a0), (l1, a1) = run(batch), run(views)
    assert torch.isfinite(l1).all() and torch.isfinite(a1).all()
    torch.testing.assert_close(l1[:3, :4], l0, rtol=0, atol=2e-5)
    torch.testing.assert_close(a1[:3], a0, rtol=0, atol=2e-5)


def test_batcher_budget(tiny_ckpt):
    from laya_grpc.inference.batcher import Batcher
    from laya_grpc.inference.runners import TorchRunner
    runner = TorchRunner(tiny_ckpt, "cpu", None)
    assert runner.batch_cost(3, 50, 120) == 150   # eager CPU: no buckets, the batch's own size
    b = Batcher(lambda name: runner, lambda name: 0)
    b.start()
    try:
        async def go():
            return await b.submit("x", synthetic_rows(2, 20, 3, runner.vocab_size))
        res = asyncio.run(go())
        assert len(res.logits) == 2 and res.batch_rows == 2
    finally:
        b.stop()



def test_batcher_splits_a_batch_over_the_token_budget(tiny_ckpt):
    """One job larger than the budget runs as several forwards that each fit it, with the same
    answers as one forward (so a coalesced or huge request never needs an uncaptured shape)."""
    from laya_grpc.inference.batcher import Batcher
    from laya_grpc.inference.runners import TorchRunner
    runner = TorchRunner(tiny_ckpt, "cpu", None)
    shapes = []
    forward = runner.forward

    def recording(batch):
        shapes.append(batch["input_ids"].shape)
        return forward(batch)
    runner.forward = recording
    rows = synthetic_rows(10, 40, 3, runner.vocab_size)
    whole_logits, whole_act = forward(rows.pad(0, pad_to=40))
    b = Batcher(lambda name: runner, lambda name: 0, max_batch_tokens=100)
    b.start()
    try:
        async def go():
            return await b.submit("x", rows)
        res = asyncio.run(go())
    finally:
        b.stop()
    assert len(shapes) == 5 and all(r * t <= 100 for r, t in shapes)   # 10 rows x 40 tokens in 2-row forwards
    assert len(res.logits) == 10
    for i in range(10):
        np.testing.assert_allclose(res.logits[i], whole_logits[i, :3], atol=2e-5)
    np.testing.assert_allclose(res.act_logits, whole_act[:10], atol=2e-5)
