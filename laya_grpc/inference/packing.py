"""Row packing for the CUDA graphs: several rows laid end to end in one token stream.

Why: padded batches cost rows x longest tokens. A short request of 132 tokens pads to the 160 bucket,
and a batch that mixes one 500-token row with 63 short ones pads every row to 512. Packed, a batch
costs its real tokens rounded up to one token bucket, and every layer but attention is per token
anyway. Attention stays exact: each row is a segment that attends only within itself, with
positions counted from its own first token (cuda_attention.attention_packed), so the numbers are
the padded batch's up to float rounding (tests/test_row_packing.py).

The graph for a bucket has fixed shapes: `tokens` (the stream, its tail filled with pad ids that
belong to no segment and are never read), `segments` slots (rows; spare slots have length 0) plus one
empty slot that spare attention blocks point at, and `markers` per row. The attention block table
lists one (segment, first query) entry per BLOCK_M queries of each segment; its fixed length
`tokens // BLOCK_M + segments` bounds sum(ceil(len / BLOCK_M)) for any rows that fit.

Plain numpy, so the plan and the fill run (and are tested) without a GPU.
"""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

import numpy as np

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.wire.packed_rows import PackedRows

# total tokens of a packed batch: fine steps where one row lands, coarser ones for batches
PACKED_TOKEN_BUCKETS = (32, 64, 96, 128, 160, 192, 224, 256, 320, 384, 448, 512, 640, 768, 896, 1024,
                        1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096)
_LARGE_STEP = 1024          # beyond the list: multiples of this
_TOKENS_PER_SLOT = 32       # segment slots per bucket: one per 32 tokens (rounded to a power of two)
_MIN_SLOTS = 4
_SMALL_FILL_ROWS = 8
FIELDS = ("ids", "tok_qtype", "starts", "lengths", "blk_seg", "blk_m0", "marker_pos", "marker_mask")


@dataclass(frozen=True)
class PackedBucket:
    tokens: int
    segments: int
    markers: int
    block_m: int = 64            # the attention block table's queries per entry
    block_n: int = 64            # the attention kernel's keys a step

    @property
    def blocks(self) -> int:
        return self.tokens // self.block_m + self.segments

    def sizes(self) -> dict:
        """Element count of each int32 field, in buffer order (slot `segments` is the empty one)."""
        s = self.segments
        return {"ids": self.tokens, "tok_qtype": self.tokens, "starts": s + 1, "lengths": s + 1,
                "blk_seg": self.blocks, "blk_m0": self.blocks, "marker_pos": s * self.markers,
                "marker_mask": s * self.markers}

    def views(self, flat) -> dict:
        """Shaped views into one flat int32 buffer (numpy array or torch tensor alike)."""
        out, at = {}, 0
        for name, n in self.sizes().items():
            v = flat[at: at + n]
            out[name] = v.reshape(self.segments, self.markers) if name.startswith("marker") else v
            at += n
        return out


@dataclass(frozen=True)
class PackedPlan:
    """Which packed shapes exist: total tokens in PACKED_TOKEN_BUCKETS (then multiples of 1024) up to
    max_batch_tokens, segment slots from the tokens (one per 32, a power of two, at most max_rows),
    markers in powers of two from min_markers. One graph per token bucket at the warm marker count,
    where the padded plan needs one per rows x tokens pair."""
    max_rows: int
    max_row_tokens: int          # one row's limit (the checkpoint's max_len; the RoPE tables' length)
    max_batch_tokens: int
    min_markers: int = 8
    block_m: int = 64
    block_n: int = 64
    query_blocks: tuple = ()     # (most tokens, block_m, block_n) in order: the blocks of buckets up to that size

    def __post_init__(self):
        if min(self.max_rows, self.max_row_tokens, self.max_batch_tokens) < 1:
            raise LayaError(Kind.INVALID, "packed plan needs positive limits, got %r" % (self,))

    @property
    def max_tokens(self) -> int:
        """The largest token bucket: the batch budget, or one longest row if that is larger."""
        return self.round_tokens(max(self.max_batch_tokens, self.max_row_tokens))

    @staticmethod
    def round_tokens(tokens: int) -> int:
        """What `tokens` real tokens cost once packed: their token bucket."""
        i = bisect.bisect_left(PACKED_TOKEN_BUCKETS, tokens)
        return PACKED_TOKEN_BUCKETS[i] if i < len(PACKED_TOKEN_BUCKETS) else -(-tokens // _LARGE_STEP) * _LARGE_STEP

    @functools.cached_property
    def _table(self) -> tuple:
        """(token buckets, their slot counts), computed once: bucket() runs on every forward."""
        toks = [t for t in PACKED_TOKEN_BUCKETS if t < self.max_tokens]
        t = PACKED_TOKEN_BUCKETS[-1] + _LARGE_STEP
        while t < self.max_tokens:
            toks.append(t)
            t += _LARGE_STEP
        toks.append(self.max_tokens)
        return tuple(toks), tuple(self.slots(t) for t in toks)

    def slots(self, tokens: int) -> int:
        want = max(_MIN_SLOTS, tokens // _TOKENS_PER_SLOT)
        return min(self.max_rows, 1 << (want - 1).bit_length())

    def _find(self, rows: int, tokens: int, markers: int):
        toks, slots = self._table
        for i in range(bisect.bisect_left(toks, tokens), len(toks)):
            if slots[i] >= rows:
                k = 1 << (max(self.min_markers, markers, 1) - 1).bit_length()
                return PackedBucket(toks[i], slots[i], k, *self.blocks_at(toks[i]))
        return None

    def bucket(self, rows: int, tokens: int, markers: int) -> PackedBucket:
        """The smallest bucket holding `rows` rows of `tokens` tokens in all; beyond the plan: INVALID."""
        b = self._find(rows, tokens, markers) if rows <= self.max_rows else None
        if b is None:
            raise LayaError(Kind.INVALID, "packed batch of %d rows / %d tokens exceeds the graph plan (at most %d "
                            "rows, %d tokens)" % (rows, tokens, min(self.max_rows, self._table[1][-1]),
                                                  self.max_tokens))
        return b

    def warm_buckets(self) -> list:
        return [PackedBucket(t, s, self.min_markers, *self.blocks_at(t)) for t, s in zip(*self._table)]

    def blocks_at(self, tokens: int) -> tuple:
        """(queries per block-table entry, keys a step) in the bucket of `tokens` tokens: the attention
        kernel's BLOCK_M and BLOCK_N there (cuda_attention.EXACT_BLOCKS says why they differ by size)."""
        for most, block_m, block_n in self.query_blocks:
            if tokens <= most:
                return block_m, block_n
        return self.block_m, self.block_n

    def split(self, rows: PackedRows) -> list:
        """Contiguous row ranges, each within max_batch_tokens and one bucket (a row alone always fits:
        the largest bucket holds a row of max_row_tokens)."""
        n, total = rows.n, len(rows.ids)
        if n <= self.max_rows and total <= self.max_batch_tokens and self._find(n, total, 1) is not None:
            return [range(0, n)]                      # the common case: one forward
        lens = rows.lengths.tolist()
        out, a, total = [], 0, 0
        for i, t in enumerate(lens):
            if i > a and (total + t > self.max_batch_tokens or i - a + 1 > self.max_rows
                          or self._find(i - a + 1, total + t, 1) is None):
                out.append(range(a, i))
                a, total = i, 0
            total += t
        if lens:
            out.append(range(a, len(lens)))
        return out


def fill(views: dict, rows: PackedRows, b: PackedBucket, pad_id: int) -> int:
    """Write `rows` into a bucket's int32 views; every element is written (buffers are reused).
    A few rows are written slice by slice (a request's usual case: ~10 us), more with index arrays."""
    n, total = rows.n, len(rows.ids)
    ro, mo = rows.row_offsets.tolist(), rows.marker_offsets.tolist()
    if n > b.segments or total > b.tokens or any(mo[i + 1] - mo[i] > b.markers for i in range(n)):
        raise LayaError(Kind.INTERNAL, "%d rows / %d tokens do not fit packed bucket %r" % (n, total, b))
    ids, tq = views["ids"], views["tok_qtype"]
    ids[:total] = rows.ids
    ids[total:] = pad_id
    tq[total:] = 0
    starts, ln = views["starts"], views["lengths"]
    starts[:n] = ro[:-1]
    starts[n:] = 0
    lens = rows.lengths
    ln[:n] = lens
    ln[n:] = 0                                   # spare slots and the empty slot b.segments
    seg, m0 = views["blk_seg"], views["blk_m0"]
    mpos, mmask = views["marker_pos"], views["marker_mask"]
    mpos[...] = 0
    mmask[...] = 0
    bm = b.block_m
    if n <= _SMALL_FILL_ROWS:
        used, qt = 0, rows.qtypes.tolist()
        for i in range(n):
            a, e = ro[i], ro[i + 1]
            tq[a:e] = qt[i]
            k = -(-(e - a) // bm)
            seg[used: used + k] = i
            m0[used: used + k] = range(0, k * bm, bm)
            used += k
            c, d = mo[i], mo[i + 1]
            mpos[i, : d - c] = rows.markers[c:d] + a
            mmask[i, : d - c] = 1
    else:
        tq[:total] = np.repeat(rows.qtypes, lens)
        nb = -(-lens // bm)                      # query blocks per segment
        used = int(nb.sum())
        seg[:used] = np.repeat(np.arange(n, dtype=np.int32), nb)
        m0[:used] = (np.arange(used) - np.repeat(np.cumsum(nb) - nb, nb)) * bm
        counts = rows.marker_counts
        if len(rows.markers):
            r = np.repeat(np.arange(n), counts)
            c = np.arange(len(rows.markers)) - np.repeat(rows.marker_offsets[:-1], counts)
            mpos[r, c] = rows.markers + np.repeat(rows.row_offsets[:-1], counts)   # token index in the stream
            mmask[r, c] = 1
    seg[used:] = b.segments                      # spare blocks: the empty slot, nothing to do
    m0[used:] = 0
    return n


def rows_from_padded(batch: dict) -> PackedRows:
    """A padded batch (PackedRows.pad output) back as rows, for callers that hold padded dicts."""
    att = np.asarray(batch["attention_mask"]).astype(bool)
    mm = np.asarray(batch["marker_mask"]).astype(bool)
    lens, counts = att.sum(1), mm.sum(1)
    off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    moff = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return PackedRows(ids=np.asarray(batch["input_ids"])[att].astype(np.int32), row_offsets=off,
                      markers=np.asarray(batch["marker_pos"])[mm].astype(np.int32), marker_offsets=moff,
                      qtypes=np.asarray(batch["qtype"]).astype(np.int32))
