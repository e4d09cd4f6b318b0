"""Tokenize + pack + pad per named case: the old whole-text path vs split_encode's fast path.

`python -m benchmarks.tokenize_speed --ckpt DIR [--iters N] [--sweep]`

"old" is what laya_grpc.tokenizer.encoding did before: one `encode_batch` of each whole text.
"new" is the current TextEncoder (encode_batch_fast, long states cut into pieces where exact).
Both run interleaved in one process, steady state (question heads cached, as when serving), and
must give the same rows and usage. `--sweep` also times the bare encode of one text of growing
length (old, new, new without splitting), to place split_encode.MIN_SPLIT_CHARS on this host.
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import numpy as np

from laya_grpc.bench.inputs import _WORDS, named_cases
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.decisions.questions import parse_questions
from laya_grpc.core.checkpoints.sources import open_source
from laya_grpc.tokenizer import split_encode
from laya_grpc.tokenizer.encoding import TextEncoder


def _pct(us: list, q: float) -> float:
    return float(np.percentile(np.asarray(us), q))


def interleaved(fns: dict, iters: int, warmup: int) -> dict:
    """Microseconds per call of each fn, calls round-robin so load drift hits all alike."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    out = {name: [] for name in fns}
    for _ in range(iters):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            out[name].append((time.perf_counter() - t0) * 1e6)
    return out


def _row(label: str, us: list, base: list = None) -> str:
    line = "  %-22s p50 %8.1f us  p95 %8.1f us" % (label, _pct(us, 50), _pct(us, 95))
    if base is not None:
        line += "  (x%.2f at p50)" % (_pct(base, 50) / _pct(us, 50))
    return line


def cases_report(new: TextEncoder, old: TextEncoder, iters: int, warmup: int) -> None:
    for case in named_cases():
        qs = parse_questions(case.questions)
        a, b = old.encode(case.state, qs), new.encode(case.state, qs)
        if a != b:
            sys.exit("case %s: the fast path's rows/usage differ from the whole-text path" % case.name)

        def run(enc, state=case.state):
            return PackedRows.from_rows(enc.encode(state, qs).rows).pad(new.pad_id)
        text = case.state if isinstance(case.state, str) else str(case.state)
        t = interleaved({"old": lambda: run(old), "new": lambda: run(new)}, iters, warmup)
        print("%s: %d chars, %d state tokens, %d pieces" % (case.name, len(text), b.usage.state_tokens,
                                                            new._fast.pieces_for(text)))
        print(_row("old (whole text)", t["old"]))
        print(_row("new", t["new"], t["old"]))


def sweep(new: TextEncoder, iters: int, warmup: int) -> None:
    fast = new._fast
    unsplit = split_encode.FastEncoder(fast.tok, "sweep", max_pieces=1)
    whole = split_encode.WholeTextEncoder(fast.tok)
    rng = random.Random(3)
    print("bare encode of one text (old | new without splitting | new):")
    for chars in (500, 750, 1000, 1250, 1500, 2000, 3000, 4000, 6000, 8000, 12000, 16000, 32000):
        words = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(rng.choice(_WORDS))
        text = " ".join(words)
        t = interleaved({"old": lambda: whole.encode([text]), "unsplit": lambda: unsplit.encode([text]),
                         "new": lambda: fast.encode([text])}, iters, warmup)
        print("  %6d chars, %2d pieces: %8.1f | %8.1f | %8.1f us p50  (new x%.2f)"
              % (len(text), fast.pieces_for(text), _pct(t["old"], 50), _pct(t["unsplit"], 50), _pct(t["new"], 50),
                 _pct(t["old"], 50) / _pct(t["new"], 50)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="checkpoint directory (its tokenizer/ and config are used)")
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--sweep", action="store_true", help="also time texts of growing length")
    p.add_argument("--max-pieces", type=int, default=None, help="override split_encode's rayon thread count")
    p.add_argument("--piece-chars", type=int, default=None)
    p.add_argument("--min-split-chars", type=int, default=None)
    a = p.parse_args(argv)
    if a.piece_chars:
        split_encode.PIECE_CHARS = a.piece_chars
    if a.min_split_chars:
        split_encode.MIN_SPLIT_CHARS = a.min_split_chars
    ckpt = open_source(a.ckpt)
    kw = dict(max_len=int(ckpt.max_len), head_max_len=int(ckpt.head_max_len), parallel_layout=ckpt.parallel)
    new = TextEncoder(ckpt.tokenizer_dir, **kw)
    fast = new._fast
    if a.max_pieces or a.piece_chars or a.min_split_chars:
        new._fast = fast = split_encode.FastEncoder(fast.tok, "bench", max_pieces=a.max_pieces,
                                                    piece_chars=split_encode.PIECE_CHARS,
                                                    min_split_chars=split_encode.MIN_SPLIT_CHARS)
    old = TextEncoder(ckpt.tokenizer_dir, **kw)
    old._fast = split_encode.WholeTextEncoder(old._fast.tok)
    print("tokenizer %s: split mode %s (%s); ascii twin %s; up to %d pieces of ~%d chars from %d chars"
          % (ckpt.tokenizer_dir, fast.policy.mode, fast.policy.reason, "on" if fast.twin else "off",
             fast.max_pieces, fast.piece_chars, fast.min_split_chars))
    cases_report(new, old, a.iters, a.warmup)
    if a.sweep:
        sweep(new, max(50, a.iters // 5), max(10, a.warmup // 5))
    return 0


if __name__ == "__main__":
    sys.exit(main())
