"""Token rows for (state, questions), byte-identical to upstream laya 0.4.15's `Agent._encode_state`.

Upstream (common.py `build_head` / `build_sequence` / `parallel_layout`, agent.py `_encode_state`
and `predict_batch`'s usage block), per question row:

    [CLS] <type> question: <ins>[:max(8, budget)] [SEP] [MASK] opt... [MASK] opt... [SEP] state [SEP]

* every text has only the mask string replaced by " " (other special strings such as `[SEP]` ARE
  tokenised as the special tokens themselves);
* an option is `[MASK]` + the first 48 tokens of " " + its text, in `option_order` slot order;
  if the options leave the instruction less than 16 tokens of `head_max_len`, each option is cut
  to `max(4, (head_max_len - 16) // n)` tokens (collapsed spans are reported in usage.options);
* the state is tokenised once, cut to `max_len - len(head) - 1` tokens from the right, or from the
  left for a list state (a conversation keeps its newest turns); the row is clamped to `max_len`
  and a question whose markers fall past it is refused with upstream's ValueError text.

Only the `tokenizers` library is used. Requests repeat the same questions, so each question head is
cached per `head_max_len`; all texts still to tokenise in a call go through one `encode_batch_fast`
(same ids as `encode_batch`, no offsets), long states cut into pieces encoded in parallel where that
is provably exact for the tokenizer (split_encode.py).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.decisions.answers import OptionUsage, Usage
from laya_grpc.core.wire.question_wire import StateText, state_of
from laya_grpc.core.decisions.questions import Question

from .special_tokens import load_tokenizer
from .split_encode import FastEncoder

OPTION_TOKEN_CAP = 48          # `truncation=True, max_length=48` on every option text
_HEAD_CACHE_SIZE = 1024


@dataclass
class Row:
    ids: list[int]
    markers: list[int]
    qtype: int
    position_ids: Optional[list[int]] = None   # parallel option layout only
    option_ids: Optional[list[int]] = None


@dataclass
class EncodedState:
    rows: list[Row]          # one per question, question order
    usage: Usage             # upstream's usage block for this state


@dataclass
class EncodeJob:
    """One request's worth of work: its states and their shared questions and budgets."""
    states: list
    questions: list
    max_len: Optional[int] = None
    head_max_len: Optional[int] = None


@dataclass(frozen=True)
class _Head:
    ids: tuple[int, ...]
    markers: tuple[int, ...]
    n_options: int
    distinct: int
    tokens_per_option: Optional[int]


def parallel_layout(markers: Sequence[int], head_len: int, length: int) -> tuple[list[int], list[int]]:
    """Upstream `parallel_layout`: every option slot starts at the same position id."""
    if not markers:
        return list(range(length)), [0] * length
    start = markers[0]
    spans = list(zip(markers, list(markers[1:]) + [head_len - 1]))
    position_ids, option_ids = list(range(start)), [0] * start
    for s, (a, b) in enumerate(spans):
        position_ids += range(start, start + b - a)
        option_ids += [s + 1] * (b - a)
    after = start + max(b - a for a, b in spans)
    position_ids += range(after, after + length - len(position_ids))
    option_ids += [0] * (length - len(option_ids))
    return position_ids, option_ids


class TextEncoder:
    """Tokenizer + upstream's sequence rules for one checkpoint."""

    def __init__(self, tokenizer_dir: str, *, max_len: int, head_max_len: int, parallel_layout: bool = False):
        loaded = load_tokenizer(tokenizer_dir)
        self._tok = loaded.tokenizer
        self._fast = FastEncoder(loaded.tokenizer, tokenizer_dir)
        self._truncation_side = loaded.truncation_side
        self.fingerprint = loaded.fingerprint
        self.mask_token = loaded.mask_token
        self.cls_id, self.sep_id = loaded.cls_id, loaded.sep_id
        self.pad_id, self.mask_id = loaded.pad_id, loaded.mask_id
        self.max_len = max_len
        self.head_max_len = head_max_len
        self.parallel_layout = parallel_layout
        self._heads: OrderedDict[tuple, _Head] = OrderedDict()
        self._lock = threading.Lock()

    # -- tokenisation -------------------------------------------------------------------------

    def _encode_texts(self, texts: list[str]) -> list[list[int]]:
        """The ids of each text, exactly `encode_batch(texts, add_special_tokens=False)`'s."""
        return self._fast.encode(texts)

    def _cap_option(self, ids: list[int]) -> list[int]:
        if self._truncation_side == "right":
            return ids[:OPTION_TOKEN_CAP]
        return ids[-OPTION_TOKEN_CAP:]

    def _scrub(self, text: str) -> str:
        return text.replace(self.mask_token, " ")

    @staticmethod
    def _head_key(q: Question, head_max_len: int) -> tuple:
        return (q.type, q.instructions, q.options, q.option_order, head_max_len)

    def _head_texts(self, q: Question) -> list[str]:
        order = q.option_order if q.option_order is not None else range(len(q.options))
        return ["%s question: %s" % (q.type, self._scrub(q.instructions))] + \
               [" " + self._scrub(q.options[i]) for i in order]

    def _build_head(self, token_lists: list[list[int]], head_max_len: int) -> _Head:
        """Upstream `build_head` from the tokenised [instruction, slot options...] texts."""
        head_ids = token_lists[0]
        opt_ids = [[self.mask_id] + self._cap_option(ids) for ids in token_lists[1:]]
        budget = head_max_len - sum(len(o) for o in opt_ids)
        per_option = None
        if budget < 16:
            per_option = max(4, (head_max_len - 16) // max(1, len(opt_ids)))
            opt_ids = [o[:per_option] for o in opt_ids]
            budget = head_max_len - sum(len(o) for o in opt_ids)
        ids = [self.cls_id] + head_ids[:max(8, budget)] + [self.sep_id]
        markers = []
        for o in opt_ids:
            markers.append(len(ids))
            ids.extend(o)
        ids.append(self.sep_id)
        return _Head(tuple(ids), tuple(markers), len(opt_ids), len({tuple(o) for o in opt_ids}), per_option)

    # -- public API ---------------------------------------------------------------------------

    def encode(self, state: Any, questions: list[Question], max_len: Optional[int] = None,
               head_max_len: Optional[int] = None) -> EncodedState:
        return self.encode_many([state], questions, max_len, head_max_len)[0]

    def encode_many(self, states: list, questions: list[Question], max_len: Optional[int] = None,
                    head_max_len: Optional[int] = None) -> list[EncodedState]:
        """One `EncodedState` per state, each exactly what upstream builds for it alone."""
        out = self.encode_jobs([EncodeJob(list(states), questions, max_len, head_max_len)])[0]
        if isinstance(out, LayaError):
            raise out
        return out

    def encode_jobs(self, jobs: Sequence["EncodeJob"]) -> list:
        """Several independent requests through ONE `encode_batch` call (the tokenizer service
        batches concurrent requests this way). Per job: its EncodedStates, or the LayaError that
        job alone fails with; one bad request never fails the others."""
        texts: list[str] = []
        plans = []
        missing: dict[tuple, tuple[Question, int]] = {}
        heads: dict[tuple, _Head] = {}
        with self._lock:
            for job in jobs:
                hml = self.head_max_len if job.head_max_len is None else job.head_max_len
                for q in job.questions:
                    key = self._head_key(q, hml)
                    head = self._heads.get(key)
                    if head is not None:
                        self._heads.move_to_end(key)
                        heads[key] = head
                    elif key not in missing:
                        missing[key] = (q, hml)
        for job in jobs:
            first = len(texts)
            job.states = [state_of(s) for s in job.states]   # each state's text and cut side, made once
            if job.questions:
                texts.extend(self._scrub(s.text) for s in job.states)
            plans.append(first)
        spans = []
        for key, (q, hml) in missing.items():
            head_texts = self._head_texts(q)
            spans.append((key, hml, len(texts), len(texts) + len(head_texts)))
            texts.extend(head_texts)
        encoded = self._fast.encode(texts, lazy=True)   # a long state's ids are sliced on demand
        if spans:
            with self._lock:
                for key, hml, a, b in spans:
                    heads[key] = self._build_head(encoded[a:b], hml)
                    self._heads[key] = heads[key]
                    while len(self._heads) > _HEAD_CACHE_SIZE:
                        self._heads.popitem(last=False)
        results: list = []
        for job, first in zip(jobs, plans):
            if not job.questions:
                results.append([EncodedState(rows=[], usage=Usage())
                                for _ in job.states])
                continue
            ml = self.max_len if job.max_len is None else job.max_len
            hml = self.head_max_len if job.head_max_len is None else job.head_max_len
            try:
                results.append([self._assemble(state, encoded[first + i], job.questions, heads, ml, hml)
                                for i, state in enumerate(job.states)])
            except LayaError as e:
                results.append(e)
        return results

    def _assemble(self, state: StateText, state_ids, questions: list[Question], heads: dict,
                  max_len: int, head_max_len: int) -> EncodedState:
        """Upstream `_encode_state` + `build_sequence` for one state, and its usage block
        (`state_ids`: a list or a `PieceIds`; only its length and slices are used)."""
        truncate_left = state.keep_end
        rows: list[Row] = []
        dropped_by_q: list[int] = []
        collapsed: list[OptionUsage] = []
        n_state = len(state_ids)
        for q in questions:
            head = heads[self._head_key(q, head_max_len)]
            room = max(0, max_len - len(head.ids) - 1)
            st = state_ids[max(0, n_state - room):] if truncate_left else state_ids[:room]
            ids = list(head.ids) + st + [self.sep_id]
            layout = parallel_layout(head.markers, len(head.ids), len(ids)) if self.parallel_layout else None
            ids = ids[:max_len]
            markers = [m for m in head.markers if m < max_len]
            if len(markers) != head.n_options:
                raise LayaError(Kind.INVALID,
                                "question %r: only %d of its %d option markers fit in max_len=%d with "
                                "head_max_len=%d spent on the question; lower head_max_len, raise max_len, "
                                "or use fewer options"
                                % (q.qid, len(markers), head.n_options, max_len, head_max_len))
            row = Row(ids=ids, markers=markers, qtype=q.qtype)
            if layout is not None:
                row.position_ids, row.option_ids = layout[0][:max_len], layout[1][:max_len]
            rows.append(row)
            dropped_by_q.append(n_state - len(st))
            if head.distinct < head.n_options:
                collapsed.append(OptionUsage(q.qid, head.n_options, head.distinct, head.tokens_per_option))
        dropped = max(dropped_by_q)
        usage = Usage(input_tokens=sum(len(r.ids) for r in rows), output_tokens=0, state_tokens=n_state,
                      state_tokens_dropped=dropped, truncated=dropped > 0,
                      truncated_questions=tuple(q.qid for q, d in zip(questions, dropped_by_q) if d > 0),
                      options=tuple(collapsed))
        return EncodedState(rows=rows, usage=usage)
