"""The bench's load clients end with an error, not a wait without end, when a client process dies."""
import multiprocessing as mp
import sys
import time

import pytest

from laya_grpc.bench.service import _next_result


def test_a_client_process_that_dies_is_reported_at_once():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=sys.exit, args=(3,))
    p.start()
    p.join()
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"exit codes \[3\]"):
        _next_result(q, [p], time.perf_counter() + 600)
    assert time.perf_counter() - t0 < 30


def test_a_result_is_returned_as_sent():
    q = mp.get_context("spawn").Queue()
    q.put(([0.001], {"200": 1}))
    assert _next_result(q, [], time.perf_counter() + 30) == ([0.001], {"200": 1})
