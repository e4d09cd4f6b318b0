"""Rows -> padded batch arrays, exactly as upstream `laya.common.collate_items` pads them.

Padding values are part of the model's input contract: ids are padded with the tokenizer's
pad id, attention mask 0, marker positions 0 (gathered from CLS, then masked to -1e4 by
`marker_mask`), parallel-layout position/option ids 0. Numpy only, so the batcher can build
batches without touching torch; the model side converts with `torch.from_numpy`.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from laya_grpc.errors import Kind, LayaError


def collate(rows: Sequence[Any], pad_id: int) -> dict[str, np.ndarray]:
    """Pad `rows` (objects with ids, markers, qtype, position_ids, option_ids) into one batch.

    Returns int64 `input_ids`/`attention_mask` [B,L], int64 `marker_pos` + bool `marker_mask`
    [B,Kmax], int64 `qtype` [B], and int64 `position_ids`/`option_ids` [B,L] when the rows carry
    the parallel layout (all rows or none: mixed layouts would run rows through the wrong masks).
    """
    if not rows:
        raise LayaError(Kind.INTERNAL, "collate: empty batch")
    n = len(rows)
    width = max(len(r.ids) for r in rows)
    kmax = max(len(r.markers) for r in rows)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    att = np.zeros((n, width), dtype=np.int64)
    mpos = np.zeros((n, kmax), dtype=np.int64)
    mmask = np.zeros((n, kmax), dtype=bool)
    for i, r in enumerate(rows):
        ids[i, :len(r.ids)] = r.ids
        att[i, :len(r.ids)] = 1
        mpos[i, :len(r.markers)] = r.markers
        mmask[i, :len(r.markers)] = True
    out = {"input_ids": ids, "attention_mask": att, "marker_pos": mpos, "marker_mask": mmask,
           "qtype": np.array([r.qtype for r in rows], dtype=np.int64)}
    parallel = [getattr(r, "option_ids", None) is not None for r in rows]
    if any(parallel):
        if not all(parallel):
            raise LayaError(Kind.INTERNAL, "collate: some rows carry a parallel option layout and some do not")
        pos = np.zeros((n, width), dtype=np.int64)
        opt = np.zeros((n, width), dtype=np.int64)
        for i, r in enumerate(rows):
            if len(r.position_ids) != len(r.ids) or len(r.option_ids) != len(r.ids):
                raise LayaError(Kind.INTERNAL, "collate: row %d has %d ids but %d position ids / %d option ids"
                                % (i, len(r.ids), len(r.position_ids), len(r.option_ids)))
            pos[i, :len(r.ids)] = r.position_ids
            opt[i, :len(r.ids)] = r.option_ids
        out["position_ids"], out["option_ids"] = pos, opt
    return out
