"""Row packing (inference/packing.py, cuda_attention.attention_packed, LayaTorch.forward_packed)
on CPU, its Triton kernels through Triton's interpreter (TRITON_INTERPRET=1), the same kernel code
the H200 runs.

Packed rows must compute what the same rows padded one per row compute: the attention kernel per
segment against the reference masks on that segment alone, the whole network's logits against
the upstream-exact reference `forward` on the padded batch, and the runner and the batcher
splitting big batches by the plan with unchanged answers. The plan and fill are checked for what
the graphs rely on: every buffer element written, every query of every segment in exactly one
attention block, buckets bounded.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

import triton_interpreter  # noqa: E402  (first: sets TRITON_INTERPRET before triton is imported)

triton_interpreter.require()
torch = pytest.importorskip("torch")

from laya_grpc.inference import cuda_attention as ca  # noqa: E402
from laya_grpc.inference import cuda_kernels as ck  # noqa: E402
from laya_grpc.inference.cuda_graphs import PackedForward, packed_plan  # noqa: E402
from laya_grpc.inference.packing import PackedBucket, PackedPlan, fill, rows_from_padded  # noqa: E402
from laya_grpc.inference.registry import synthetic_rows  # noqa: E402
from laya_grpc.inference.runners import TorchRunner, resolve_pack_rows  # noqa: E402
from laya_grpc.inference.torch_model import LayaTorch  # noqa: E402
from laya_grpc.core.errors import LayaError  # noqa: E402
from laya_grpc.core.wire.packed_rows import PackedRows  # noqa: E402
from test_cuda_attention import _reference  # noqa: E402  (tests/ is on sys.path under pytest)
from test_fused_encoder import _batch  # noqa: E402


def _rows(lengths, markers=1, seed=0) -> PackedRows:
    rng = np.random.default_rng(seed)
    lengths = list(lengths)
    m = [min(markers, n) for n in lengths]
    return PackedRows(ids=rng.integers(5, 90, size=sum(lengths), dtype=np.int32),
                      row_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32),
                      markers=np.concatenate([np.arange(k, dtype=np.int32) for k in m]) if m else np.zeros(0, np.int32),
                      marker_offsets=np.concatenate([[0], np.cumsum(m)]).astype(np.int32),
                      qtypes=(np.arange(len(lengths)) % 3).astype(np.int32))


def _filled(rows: PackedRows, b: PackedBucket) -> dict:
    flat = np.full(sum(b.sizes().values()), -7, dtype=np.int32)      # poisoned: fill must write every element
    views = b.views(flat)
    fill(views, rows, b, pad_id=3)
    assert (flat != -7).all()
    return views


# ------------------------------------------------------------------------------ plan and fill

def test_plan_buckets_rows_and_tokens():
    plan = PackedPlan(max_rows=256, max_row_tokens=512, max_batch_tokens=16384)
    short = plan.bucket(1, 132, 3)
    assert (short.tokens, short.markers) == (160, 8) and short.segments >= 1
    many = plan.bucket(64, 64 * 132, 2)
    assert many.tokens == 9216 and many.segments >= 64       # 8,448 real tokens: 9% padding, not 64 x 160
    tiny_rows = plan.bucket(40, 400, 2)                        # rows shorter than 32 tokens: a bigger bucket
    assert tiny_rows.segments >= 40 and tiny_rows.tokens >= 400
    assert plan.bucket(1, 10, 20).markers == 32
    with pytest.raises(LayaError, match="exceeds the graph plan"):
        plan.bucket(1, plan.max_tokens + 1, 1)
    with pytest.raises(LayaError, match="exceeds the graph plan"):
        plan.bucket(257, 1000, 1)
    warm = plan.warm_buckets()
    assert len(warm) < 45 and warm[-1].tokens == plan.max_tokens == 16384
    assert [b.tokens for b in warm] == sorted({b.tokens for b in warm})


def test_split_keeps_every_part_within_budget_and_bucket():
    plan = PackedPlan(max_rows=8, max_row_tokens=512, max_batch_tokens=600)
    rows = _rows([500, 90, 30, 512, 5, 5, 5, 5, 5, 5, 5, 5, 200, 300])
    parts = plan.split(rows)
    assert [i for p in parts for i in p] == list(range(rows.n))    # contiguous, in order, all rows
    for p in parts:
        total = int(rows.lengths[p.start: p.stop].sum())
        assert len(p) == 1 or total <= plan.max_batch_tokens
        assert len(p) <= plan.max_rows
        plan.bucket(len(p), total, 1)                              # a captured shape exists for it
    assert len(parts) < rows.n                                     # and rows really share forwards


@pytest.mark.parametrize("lengths", [(70, 1, 64, 130, 5), (9, 64, 65, 3, 1, 128, 40, 40, 40, 7, 200, 12)],
                         ids=["few-rows", "many-rows"])
def test_fill_covers_each_query_once_and_pads_safely(lengths):
    rows = _rows(lengths, markers=3)
    b = PackedPlan(max_rows=64, max_row_tokens=512, max_batch_tokens=1024).bucket(rows.n, len(rows.ids), 3)
    v = _filled(rows, b)
    total = len(rows.ids)
    assert (v["ids"][:total] == rows.ids).all() and (v["ids"][total:] == 3).all()
    covered = np.zeros(total, dtype=int)
    for s, m0 in zip(v["blk_seg"], v["blk_m0"]):
        if s == b.segments:
            assert v["lengths"][s] == 0            # spare blocks point at the empty slot
            continue
        start, n = v["starts"][s], v["lengths"][s]
        covered[start + m0: start + min(m0 + b.block_m, n)] += 1
    assert (covered == 1).all()
    assert (v["lengths"][rows.n:] == 0).all()
    # markers as stream indices, their rows' qtype on every token
    for i in range(rows.n):
        a = int(rows.row_offsets[i])
        got = v["marker_pos"][i][v["marker_mask"][i] == 1]
        assert (got == a + rows.markers[rows.marker_offsets[i]: rows.marker_offsets[i + 1]]).all()
        assert (v["tok_qtype"][a: a + int(rows.lengths[i])] == rows.qtypes[i]).all()


def test_served_plan_takes_the_exact_blocks_for_float32_buckets_by_size():
    """The exact mode's attention (float32) takes 16 queries a program at 64 keys a step in buckets of
    at most 256 tokens, 32 queries at 64 keys up to 2,048, and 64 queries at 32 keys beyond
    (cuda_attention.EXACT_BLOCKS, EXACT_LARGE_BLOCKS); 16-bit attention BLOCK_M and BLOCK_N everywhere.
    The fill writes each bucket's table for its own block (every query covered once: test above)."""
    assert ca.EXACT_BLOCKS == ((256, 16, 64), (2048, 32, 64)) and ca.EXACT_LARGE_BLOCKS == (64, 32)
    assert (ca.BLOCK_M, ca.BLOCK_N) == (64, 64)
    exact = packed_plan(256, 512, 16384, torch.float32)
    fast = packed_plan(256, 512, 16384, torch.float16)

    def blocks(b):
        return b.block_m, b.block_n
    assert blocks(exact.bucket(1, 132, 3)) == (16, 64)
    assert blocks(exact.bucket(1, 256, 3)) == (16, 64)
    assert blocks(exact.bucket(2, 257, 3)) == (32, 64)          # the 320-token bucket
    assert blocks(exact.bucket(1, 512, 3)) == (32, 64)
    assert blocks(exact.bucket(12, 12 * 132, 3)) == (32, 64)    # 1,584 tokens: the 1,792-token bucket
    assert blocks(exact.bucket(16, 2048, 3)) == (32, 64)
    assert blocks(exact.bucket(16, 2049, 3)) == (64, 32)        # the 2,560-token bucket
    assert blocks(exact.bucket(64, 64 * 132, 3)) == (64, 32)
    assert {blocks(b) for b in fast.warm_buckets()} == {(64, 64)}
    assert {blocks(b) for b in exact.warm_buckets()} == {(16, 64), (32, 64), (64, 32)}
    for lengths, block_m in (([132], 16), ([300, 200], 32)):
        rows = _rows(lengths)
        b = exact.bucket(rows.n, len(rows.ids), 1)
        v = _filled(rows, b)
        assert b.block_m == block_m and b.blocks == b.tokens // block_m + b.segments
        first = -(-lengths[0] // block_m)    # the first segment's entries, then the second's from its start
        assert list(v["blk_m0"][:first]) == list(range(0, first * block_m, block_m))
        assert (v["blk_seg"][:first] == 0).all()
        if len(lengths) > 1:
            assert v["blk_m0"][first] == 0 and v["blk_seg"][first] == 1


def test_rows_from_padded_round_trips():
    rows = _rows([7, 20, 3], markers=2)
    back = rows_from_padded(rows.pad(0, pad_to=32))
    for f in ("ids", "row_offsets", "markers", "marker_offsets", "qtypes"):
        assert (getattr(back, f) == getattr(rows, f)).all(), f


def test_pack_rows_choice_is_explicit():
    assert resolve_pack_rows("auto", True, "fused", False) is True
    assert resolve_pack_rows("auto", True, "fused", True) is False          # parallel layout: padded
    assert resolve_pack_rows("auto", False, "reference", False) is False
    assert resolve_pack_rows("off", True, "fused", False) is False
    with pytest.raises(LayaError, match="parallel option layout"):
        resolve_pack_rows("on", True, "fused", True)
    with pytest.raises(LayaError, match="fused CUDA kernels"):
        resolve_pack_rows("on", True, "reference", False)
    with pytest.raises(LayaError, match="must be one of"):
        resolve_pack_rows("yes", True, "fused", False)


# ------------------------------------------------------------------------------ the kernel

KERNEL_CASES = [
    # lengths, H, hd, window, dtype
    ((70, 1, 33, 130, 5), 2, 16, 8, torch.float32),
    ((64, 65, 2), 3, 12, 100, torch.float32),
    ((131, 40), 1, 64, 64, torch.float32),
    ((50, 130, 7), 2, 16, 16, torch.float16),
]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3}


def _plan(block_m: int, block_n: int = ca.BLOCK_N, **limits) -> PackedPlan:
    """A plan whose every bucket's attention takes `block_m` queries a table entry, `block_n` keys a step."""
    return PackedPlan(**dict(dict(max_rows=64, max_row_tokens=512, max_batch_tokens=4096), **limits),
                      block_m=block_m, block_n=block_n)


# every (BLOCK_M, BLOCK_N) a served plan takes (the fast mode's, the exact mode's by bucket size), and
# 16 and 32 queries at 32 keys a step (what benchmarks/query_block_plans.py measures beside them)
SERVED_BLOCKS = sorted({(ca.BLOCK_M, ca.BLOCK_N), ca.EXACT_LARGE_BLOCKS} | {(m, n) for _, m, n in ca.EXACT_BLOCKS})
QUERY_KEY_BLOCKS = SERVED_BLOCKS + [(16, 32), (32, 32)]


@pytest.mark.parametrize("block_m,block_n", QUERY_KEY_BLOCKS)
@pytest.mark.parametrize("mode", ["full", "sliding", "full-norope"])
@pytest.mark.parametrize("lengths,H,hd,window,dtype", KERNEL_CASES)
def test_packed_attention_equals_each_row_alone(lengths, H, hd, window, dtype, mode, block_m, block_n):
    rows = _rows(lengths)
    b = _plan(block_m, block_n).bucket(rows.n, len(rows.ids), 1)
    assert (b.block_m, b.block_n) == (block_m, block_n)
    v = {k: torch.from_numpy(x.copy()) for k, x in _filled(rows, b).items()}
    g = torch.Generator().manual_seed(sum(lengths) + hd)
    qkv = torch.randn(b.tokens, 3 * H * hd, generator=g).to(dtype)
    cos, sin = (torch.randn(max(lengths) + 3, hd, generator=g).to(dtype) for _ in range(2))
    rope, sliding = mode != "full-norope", mode == "sliding"
    if not rope:     # the reference with an identity rotation: cos 1, sin 0
        cos, sin = torch.ones_like(cos), torch.zeros_like(sin)
    out = torch.full((b.tokens, H * hd), float("nan"), dtype=dtype)
    got = ca.attention_packed(qkv, cos if rope else None, sin if rope else None, v["starts"], v["lengths"],
                              v["blk_seg"], v["blk_m0"], H, window, sliding, hd ** -0.5, rope=rope, out=out,
                              block_m=block_m, block_n=block_n)
    total = len(rows.ids)
    assert got is out and torch.isfinite(got[:total]).all()
    assert torch.isnan(got[total:]).all()          # the bucket's tail belongs to no segment: never written
    for i, n in enumerate(lengths):
        a = int(rows.row_offsets[i])
        ref = _reference(qkv[a: a + n].contiguous(), cos, sin, torch.tensor([n], dtype=torch.int32), 1, n, H,
                         window, sliding, hd ** -0.5)
        torch.testing.assert_close(got[a: a + n].float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_packed_attention_steps_over_keys_in_blocks_of_block_n():
    """SLIDING: a query block's first key block starts at its band's start rounded down to block_n,
    and a key there outside every band still has its value read (weight 0, and 0 x NaN is NaN). Queries
    64-79 with a window of 8 start at key 56: block 0 with 64 keys a step, block 32 with 32. A NaN value
    at key 20 reaches those queries with 64 keys a step and not with 32, so block_n reaches the kernel."""
    rows = _rows([130])
    b = _plan(16).bucket(rows.n, len(rows.ids), 1)
    v = {k: torch.from_numpy(x.copy()) for k, x in _filled(rows, b).items()}
    H, hd = 1, 16
    qkv = torch.randn(b.tokens, 3 * H * hd, generator=torch.Generator().manual_seed(4))
    cos, sin = torch.randn(136, hd), torch.randn(136, hd)
    args = (cos, sin, v["starts"], v["lengths"], v["blk_seg"], v["blk_m0"], H, 8, True, 0.25)
    poisoned = qkv.clone()
    poisoned[20, 2 * H * hd:] = float("nan")  # the value of key 20, outside the band of queries 29 on
    clean = ca.attention_packed(qkv, *args, block_m=16, block_n=32)
    got32 = ca.attention_packed(poisoned, *args, block_m=16, block_n=32)
    got64 = ca.attention_packed(poisoned, *args, block_m=16, block_n=64)
    assert torch.isnan(got64[64:80]).all()
    torch.testing.assert_close(got32[64:80], clean[64:80], rtol=0, atol=0)
    # queries 96 on start at key 88, in block 64 either way: untouched at 64 keys a step too
    clean64 = ca.attention_packed(qkv, *args, block_m=16, block_n=64)
    torch.testing.assert_close(got64[96:130], clean64[96:130], rtol=0, atol=0)


def test_packed_attention_never_reads_another_segment():
    """Poison every token outside one segment: its output must not change (block-diagonal)."""
    rows = _rows([40, 90, 30])
    b = PackedPlan(max_rows=64, max_row_tokens=512, max_batch_tokens=4096).bucket(rows.n, len(rows.ids), 1)
    v = {k: torch.from_numpy(x.copy()) for k, x in _filled(rows, b).items()}
    H, hd = 2, 16
    qkv = torch.randn(b.tokens, 3 * H * hd, generator=torch.Generator().manual_seed(3))
    cos, sin = torch.randn(128, hd), torch.randn(128, hd)
    args = (v["starts"], v["lengths"], v["blk_seg"], v["blk_m0"], H, 8)
    clean = ca.attention_packed(qkv, cos, sin, *args, False, 0.25)
    poisoned = qkv.clone()
    poisoned[:40] = float("nan")
    poisoned[130:] = float("nan")
    got = ca.attention_packed(poisoned, cos, sin, *args, False, 0.25)
    torch.testing.assert_close(got[40:130], clean[40:130], rtol=0, atol=0)


# ------------------------------------------------------------------------------ the network

@pytest.mark.parametrize("preset,block_m,block_n", [("tiny-ml", ca.BLOCK_M, ca.BLOCK_N)] +
                         [("tiny",) + blocks for blocks in SERVED_BLOCKS])
def test_forward_packed_equals_reference_forward(preset, tiny_ckpt, tiny_ml_ckpt, block_m, block_n, monkeypatch):
    """Whole network, real tokenized rows (two states x two questions, one row past a key block and
    the window): packed logits and act logits against the upstream-exact padded `forward`, fp32, with
    each served attention block (queries a table entry, keys a step), which every attention launch
    (encoder and head) takes (a larger BLOCK_M than the table's gives the same numbers, only slower)."""
    seen, real = [], ca.attention_packed
    monkeypatch.setattr(ca, "attention_packed",
                        lambda *a, **k: seen.append((k.get("block_m"), k.get("block_n"))) or real(*a, **k))
    path = {"tiny": tiny_ckpt, "tiny-ml": tiny_ml_ckpt}[preset]
    b = _batch(path)
    model = LayaTorch.from_checkpoint(path)
    args = (b["input_ids"], b["attention_mask"], b["marker_pos"], b["marker_mask"], b["qtype"])
    with torch.inference_mode():
        ref_logits, ref_act = model(*args)
    model.use_fused_kernels()
    rows = rows_from_padded({k: t.numpy() for k, t in b.items()})
    assert int(rows.lengths.max()) > ca.BLOCK_N + model.spec.sliding_window
    plan = _plan(block_m, block_n, max_rows=16)
    logits, act = PackedForward(model, torch.device("cpu"), plan, graphs=False).forward(rows, pad_id=0)
    assert len(seen) == len(model.encoder.layers) + len(model.head.layers) and set(seen) == {(block_m, block_n)}
    K = ref_logits.shape[1]
    mask = b["marker_mask"].numpy().astype(bool)
    np.testing.assert_allclose(logits[:, :K][mask], ref_logits.numpy()[mask], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(act, ref_act.numpy(), atol=1e-4, rtol=1e-4)
    assert float(np.abs(ref_logits.numpy()[mask]).max()) > 0.5     # a real spread, not a degenerate output


def _packed_cpu_runner(path: str, max_batch_tokens: int) -> TorchRunner:
    """The CUDA runner's packed path on CPU: same plan, same fill, forward_packed run eagerly instead of
    replayed from a graph (graphs need CUDA; the kernels run in Triton's interpreter)."""
    runner = TorchRunner(path, "cpu", None, max_batch_tokens=max_batch_tokens)
    assert runner.packing is None                                  # auto never packs off CUDA
    runner.model.use_fused_kernels()
    runner.packing = packed_plan(256, 512, max_batch_tokens, runner.model.encoder.embeddings.tok_embeddings.weight.dtype)
    assert runner.packing.bucket(1, 150, 1).block_m == 16   # float32 weights: the exact mode's plan
    runner.graphs = PackedForward(runner.model, torch.device("cpu"), runner.packing, graphs=False)
    return runner


def test_rows_outside_every_segment_never_reach_an_answer(tiny_ckpt, monkeypatch):
    """A packed bucket's tail (tokens in no segment) runs through the network on whatever its buffers
    held: attention leaves those rows of its output unwritten (`attention_packed`), and the per-token
    kernels after it carry them on, so the tail may hold anything, NaN and infinity included (the
    likeliest source of the overflow warnings Triton's interpreter prints in some runs). No answer
    may read it: with every fresh kernel output filled with NaN first, the exact mode's logits and
    act logits stay the same, bit for bit, and finite."""
    runner = _packed_cpu_runner(tiny_ckpt, max_batch_tokens=4096)
    rows = synthetic_rows(3, 70, 4, runner.vocab_size, seed=5)
    bucket = runner.packing.bucket(rows.n, len(rows.ids), 4)
    assert bucket.tokens > len(rows.ids)                           # a tail exists: 210 tokens in a bucket of 224
    clean = runner.run_rows(rows, 0)
    real, tails = ck.split_out, []

    def poisoned(n, *args):
        out = real(n, *args)
        out.fill_(float("nan"))
        return out

    def attention(qkv, *args, **kwargs):
        out = real_attention(qkv, *args, **kwargs)
        tails.append(bool(torch.isnan(out[len(rows.ids):]).all()))   # the tail's rows stay unwritten
        return out

    real_attention = ca.attention_packed
    monkeypatch.setattr(ck, "split_out", poisoned)
    monkeypatch.setattr(ca, "attention_packed", attention)
    with np.errstate(all="ignore"):                                # NaN arithmetic in the tail, on purpose
        logits, act = runner.run_rows(rows, 0)
    assert tails and all(tails), tails
    assert np.isfinite(logits).all() and np.isfinite(act).all()
    np.testing.assert_array_equal(logits, clean[0])
    np.testing.assert_array_equal(act, clean[1])


def test_runner_and_batcher_pack_and_split_with_unchanged_answers(tiny_ckpt):
    from laya_grpc.inference.batcher import Batcher
    ref = TorchRunner(tiny_ckpt, "cpu", None)
    runner = _packed_cpu_runner(tiny_ckpt, max_batch_tokens=160)
    jobs = [synthetic_rows(r, t, m, ref.vocab_size, seed=r * t) for r, t, m in ((3, 40, 3), (1, 150, 5), (4, 20, 2))]
    want = [ref.run_rows(j, 0) for j in jobs]
    assert runner.batch_cost(3, 40, 120) == 128                    # real tokens, rounded to a bucket
    parts = runner.packing.split(PackedRows.concat(jobs))
    assert len(parts) > 1                                          # the budget of 160 tokens splits the batch
    b = Batcher(lambda name: runner, lambda name: 0, max_batch_tokens=160)
    b.start()
    try:
        async def go():
            return await asyncio.gather(*(b.submit("x", j) for j in jobs))
        results = asyncio.run(go())
    finally:
        b.stop()
    for res, (lg, ac), j in zip(results, want, jobs):
        assert len(res.logits) == j.n
        for i in range(j.n):
            np.testing.assert_allclose(res.logits[i], lg[i, : int(j.marker_counts[i])], atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(res.act_logits, ac, atol=1e-4, rtol=1e-4)
    # a packing runner takes rows only: a padded batch is refused by name, never unpadded again
    with pytest.raises(LayaError, match="call run_rows"):
        runner.forward(jobs[0].pad(0, pad_to=48))
