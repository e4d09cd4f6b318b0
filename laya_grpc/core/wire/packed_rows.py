"""Token rows on the wire and in the batcher: flat int32 arrays plus offsets.

The tokenizer packs its `Row`s into this form, the inference service batches and pads
straight from it (no per-token Python objects on either side). Padding follows upstream's
`collate_items` exactly: ids padded with pad_id, attention 1/0, marker positions padded with 0
and masked, parallel-layout position/option ids padded with 0.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from ..errors import Kind, LayaError

_I32 = np.dtype("<i4")
_SMALL_PAD_ROWS = 8


@dataclass
class PackedRows:
    ids: np.ndarray                   # int32 [total_tokens]
    row_offsets: np.ndarray           # int32 [n+1]
    markers: np.ndarray               # int32 [total_markers]
    marker_offsets: np.ndarray        # int32 [n+1]
    qtypes: np.ndarray                # int32 [n]
    position_ids: Optional[np.ndarray] = None   # int32 [total_tokens], parallel layout only
    option_ids: Optional[np.ndarray] = None
    fingerprint: str = ""

    @property
    def n(self) -> int:
        return len(self.qtypes)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.row_offsets)

    @property
    def marker_counts(self) -> np.ndarray:
        return np.diff(self.marker_offsets)

    # -- building -------------------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Sequence, fingerprint: str = "") -> "PackedRows":
        """From objects with .ids, .markers, .qtype and optional .position_ids/.option_ids."""
        lens = [len(r.ids) for r in rows]
        mlens = [len(r.markers) for r in rows]
        parallel = bool(rows) and rows[0].position_ids is not None
        flat = itertools.chain.from_iterable
        return cls(
            ids=np.fromiter(flat([r.ids for r in rows]), _I32, sum(lens)),
            row_offsets=_offsets(lens),
            markers=np.fromiter(flat([r.markers for r in rows]), _I32, sum(mlens)),
            marker_offsets=_offsets(mlens),
            qtypes=np.array([r.qtype for r in rows], _I32),
            position_ids=np.fromiter(flat([r.position_ids for r in rows]), _I32, sum(lens)) if parallel else None,
            option_ids=np.fromiter(flat([r.option_ids for r in rows]), _I32, sum(lens)) if parallel else None,
            fingerprint=fingerprint,
        )

    @classmethod
    def concat(cls, parts: Sequence["PackedRows"]) -> "PackedRows":
        if len(parts) == 1:
            return parts[0]
        parallel = parts[0].position_ids is not None
        if any((p.position_ids is not None) != parallel for p in parts):
            raise LayaError(Kind.INTERNAL, "cannot batch rows of the parallel and sequential layouts together")
        return cls(
            ids=np.concatenate([p.ids for p in parts]),
            row_offsets=_offsets(np.concatenate([p.lengths for p in parts])),
            markers=np.concatenate([p.markers for p in parts]),
            marker_offsets=_offsets(np.concatenate([p.marker_counts for p in parts])),
            qtypes=np.concatenate([p.qtypes for p in parts]),
            position_ids=np.concatenate([p.position_ids for p in parts]) if parallel else None,
            option_ids=np.concatenate([p.option_ids for p in parts]) if parallel else None,
            fingerprint=parts[0].fingerprint,
        )

    def take(self, index: Sequence[int]) -> "PackedRows":
        """The rows at `index`, in that order (a contiguous range is sliced, not gathered)."""
        if isinstance(index, range) and index.step == 1 and 0 <= index.start <= index.stop <= self.n:
            return self._span(index.start, index.stop)
        idx = np.asarray(index, dtype=np.int64)
        ro, mo = self.row_offsets, self.marker_offsets
        tok = np.concatenate([np.arange(ro[i], ro[i + 1]) for i in idx]) if len(idx) else np.zeros(0, np.int64)
        mk = np.concatenate([np.arange(mo[i], mo[i + 1]) for i in idx]) if len(idx) else np.zeros(0, np.int64)
        return PackedRows(
            ids=self.ids[tok], row_offsets=_offsets(self.lengths[idx]),
            markers=self.markers[mk], marker_offsets=_offsets(self.marker_counts[idx]),
            qtypes=self.qtypes[idx],
            position_ids=None if self.position_ids is None else self.position_ids[tok],
            option_ids=None if self.option_ids is None else self.option_ids[tok],
            fingerprint=self.fingerprint)

    def _span(self, a: int, b: int) -> "PackedRows":
        """Rows a..b-1 as views (all of them: self)."""
        if a == 0 and b == self.n:
            return self
        ro, mo = self.row_offsets, self.marker_offsets
        t0, t1, m0, m1 = int(ro[a]), int(ro[b]), int(mo[a]), int(mo[b])
        return PackedRows(
            ids=self.ids[t0:t1], row_offsets=(ro[a:b + 1] - ro[a]).astype(_I32, copy=False),
            markers=self.markers[m0:m1], marker_offsets=(mo[a:b + 1] - mo[a]).astype(_I32, copy=False),
            qtypes=self.qtypes[a:b],
            position_ids=None if self.position_ids is None else self.position_ids[t0:t1],
            option_ids=None if self.option_ids is None else self.option_ids[t0:t1],
            fingerprint=self.fingerprint)

    # -- padding for a forward pass -------------------------------------------------------
    def pad(self, pad_id: int, pad_to: Optional[int] = None, rows_to: Optional[int] = None,
            markers_to: Optional[int] = None) -> dict:
        """Padded int64 batch like upstream's collate_items (optionally padded further to a bucket)."""
        n, lens, mcounts = self.n, self.lengths, self.marker_counts
        L = max(int(lens.max()) if n else 1, pad_to or 0)
        K = max(int(mcounts.max()) if n else 1, markers_to or 0, 1)
        N = max(n, rows_to or 0)
        ids = np.full((N, L), pad_id, dtype=np.int64)
        att = np.zeros((N, L), dtype=np.int64)
        mpos = np.zeros((N, K), dtype=np.int64)
        mmask = np.zeros((N, K), dtype=bool)
        qtype = np.zeros((N,), dtype=np.int64)
        qtype[:n] = self.qtypes
        out = {"input_ids": ids, "attention_mask": att, "marker_pos": mpos, "marker_mask": mmask, "qtype": qtype}
        parallel = self.position_ids is not None
        if parallel:
            pos = np.zeros((N, L), dtype=np.int64)
            opt = np.zeros((N, L), dtype=np.int64)
            out["position_ids"], out["option_ids"] = pos, opt
        if n <= _SMALL_PAD_ROWS:   # row by row: a few slice copies beat building scatter indices
            ro, mo = self.row_offsets.tolist(), self.marker_offsets.tolist()
            for i in range(n):
                a, b, c, d = ro[i], ro[i + 1], mo[i], mo[i + 1]
                ids[i, : b - a] = self.ids[a:b]
                att[i, : b - a] = 1
                mpos[i, : d - c] = self.markers[c:d]
                mmask[i, : d - c] = True
                if parallel:
                    pos[i, : b - a] = self.position_ids[a:b]
                    opt[i, : b - a] = self.option_ids[a:b]
            return out
        tok_rows = np.repeat(np.arange(n), lens)
        tok_cols = np.arange(len(self.ids)) - np.repeat(self.row_offsets[:-1], lens)
        ids[tok_rows, tok_cols] = self.ids
        att[tok_rows, tok_cols] = 1
        m_rows = np.repeat(np.arange(n), mcounts)
        m_cols = np.arange(len(self.markers)) - np.repeat(self.marker_offsets[:-1], mcounts)
        mpos[m_rows, m_cols] = self.markers
        mmask[m_rows, m_cols] = True
        if parallel:
            pos[tok_rows, tok_cols] = self.position_ids
            opt[tok_rows, tok_cols] = self.option_ids
        return out

    # -- protobuf -------------------------------------------------------------------------
    def to_proto(self, msg) -> None:
        msg.ids = self.ids.astype(_I32, copy=False).tobytes()
        msg.row_offsets = self.row_offsets.astype(_I32, copy=False).tobytes()
        msg.markers = self.markers.astype(_I32, copy=False).tobytes()
        msg.marker_offsets = self.marker_offsets.astype(_I32, copy=False).tobytes()
        msg.qtypes = self.qtypes.astype(_I32, copy=False).tobytes()
        if self.position_ids is not None:
            msg.position_ids = self.position_ids.astype(_I32, copy=False).tobytes()
            msg.option_ids = self.option_ids.astype(_I32, copy=False).tobytes()
        msg.tokenizer_fingerprint = self.fingerprint

    @classmethod
    def from_proto(cls, msg, vocab_size: Optional[int] = None, max_len: Optional[int] = None) -> "PackedRows":
        """Decode and validate; a malformed message is INVALID_ARGUMENT, never a crash later."""
        def arr(b: bytes, what: str) -> np.ndarray:
            if len(b) % 4:
                raise LayaError(Kind.INVALID, "token rows: %s is not a whole number of int32 values" % what)
            return np.frombuffer(b, dtype=_I32)
        rows = cls(ids=arr(msg.ids, "ids"), row_offsets=arr(msg.row_offsets, "row_offsets"),
                   markers=arr(msg.markers, "markers"), marker_offsets=arr(msg.marker_offsets, "marker_offsets"),
                   qtypes=arr(msg.qtypes, "qtypes"),
                   position_ids=arr(msg.position_ids, "position_ids") if msg.position_ids else None,
                   option_ids=arr(msg.option_ids, "option_ids") if msg.option_ids else None,
                   fingerprint=msg.tokenizer_fingerprint)
        rows.validate(vocab_size, max_len)
        return rows

    def validate(self, vocab_size: Optional[int] = None, max_len: Optional[int] = None) -> None:
        # ndarray methods, each difference computed once: this runs on every hop of every request
        n = len(self.qtypes)
        def bad(why: str):
            raise LayaError(Kind.INVALID, "token rows: " + why)
        counts = []
        for name, off, total in (("row_offsets", self.row_offsets, len(self.ids)),
                                 ("marker_offsets", self.marker_offsets, len(self.markers))):
            if len(off) != n + 1 or off[0] != 0 or off[-1] != total:
                bad("%s must have n_rows+1 non-decreasing entries from 0 to %d" % (name, total))
            d = off[1:] - off[:-1]
            if n and d.min() < 0:
                bad("%s must have n_rows+1 non-decreasing entries from 0 to %d" % (name, total))
            counts.append(d)
        lengths, mcounts = counts
        if n and lengths.min() == 0:
            bad("empty row")
        if n and (self.qtypes.min() < 0 or self.qtypes.max() > 2):
            bad("qtype must be 0 (choice), 1 (score) or 2 (noul)")
        if len(self.ids) and (self.ids.min() < 0 or (vocab_size is not None and self.ids.max() >= vocab_size)):
            bad("token id outside the vocabulary (0..%s)" % ((vocab_size or 0) - 1))
        if max_len is not None:
            self._check_max_len(max_len, lengths)
        if len(self.markers):
            if self.markers.min() < 0:
                bad("marker position outside its row")
            if n == 1:
                if self.markers.max() >= lengths[0]:
                    bad("marker position outside its row")
            elif np.any(self.markers >= np.repeat(lengths, mcounts)):
                bad("marker position outside its row")
        for name in ("position_ids", "option_ids"):
            a = getattr(self, name)
            if a is not None and len(a) != len(self.ids):
                bad("%s must have one entry per token" % name)
        if (self.position_ids is None) != (self.option_ids is None):
            bad("position_ids and option_ids come together")

    def check_max_len(self, max_len: int) -> None:
        """validate(max_len=...) for rows already validated (the only check that can still fail)."""
        self._check_max_len(max_len, self.lengths)

    def _check_max_len(self, max_len: int, lengths: np.ndarray) -> None:
        if len(lengths) and int(lengths.max()) > max_len:
            longest = int(lengths.max())
            raise LayaError(Kind.INVALID, "token rows: a row of %d tokens is longer than the %d this checkpoint serves "
                            "on its device (its CUDA graphs are built for the checkpoint's max_len); send max_len <= %d"
                            % (longest, max_len, max_len))


def _offsets(lengths) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=_I32)
    np.cumsum(lengths, out=out[1:])
    return out
