"""Busy-polling event loops (laya_grpc/busy_poll.py, `--busy-poll-us`): the loop still wakes for
I/O and timers on time, spins only within its window, the flag refuses nonsense, and a served stack
with it set answers like one without (every child started with it)."""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import time

import pytest

from laya_grpc import busy_poll
from stack import Stack


def test_spinning_loop_serves_io_and_timers():
    async def main():
        a, b = socket.socketpair()
        ra, wa = await asyncio.open_connection(sock=a)
        rb, wb = await asyncio.open_connection(sock=b)
        for i in range(50):
            wa.write(b"%03d" % i)
            await wa.drain()
            assert await rb.readexactly(3) == b"%03d" % i
        t = time.monotonic()
        await asyncio.sleep(0.05)            # a timer past the spin window still fires on time
        slept = time.monotonic() - t
        for w in (wa, wb):
            w.close()
        return slept
    slept = busy_poll.run(main(), spin_us=2000)
    assert 0.045 <= slept < 0.5


def test_selector_spins_only_within_its_window():
    sel = busy_poll.SpinSelector(0.01)
    r, w = socket.socketpair()
    try:
        sel.register(r, 1)
        t = time.monotonic()
        assert sel.select(0.2) == []          # nothing ready: spins 10 ms, then sleeps the rest
        assert 0.19 <= time.monotonic() - t < 1.0
        w.send(b"x")
        t = time.monotonic()
        assert len(sel.select(5)) == 1
        assert time.monotonic() - t < 0.5
        r.recv(1)
        t = time.monotonic()
        assert sel.select(0) == []            # timeout 0 never spins: returns at once
        assert time.monotonic() - t < 0.005
    finally:
        sel.close()
        r.close()
        w.close()


def test_flag_refuses_negative_values():
    p = argparse.ArgumentParser()
    busy_poll.add_flag(p)
    assert p.parse_args([]).busy_poll_us == int(os.environ.get("LAYA_BUSY_POLL_US", 0))
    assert p.parse_args(["--busy-poll-us", "500"]).busy_poll_us == 500
    with pytest.raises(SystemExit):
        p.parse_args(["--busy-poll-us", "-1"])
    assert busy_poll.loop_factory(0) is None


def test_served_stack_with_busy_poll_answers(tiny_ckpt):
    q = {"u": {"type": "noul", "instructions": "Is it urgent?"}}
    with Stack({"english": tiny_ckpt}, extra_args=["--busy-poll-us", "1000", "--gateway-workers", "1",
                                                   "--tokenizer-workers", "1"]) as s:
        status, body, _ = s.post("/v1/systemone", {"state": "the server is down", "questions": q})
        assert status == 200, body
        assert body["answers"]["u"]["type"] == "noul"
        pids = os.popen("ps -o pid= --ppid %d" % s.proc.pid).read().split()
        argvs = [open("/proc/%s/cmdline" % pid, "rb").read().split(b"\0") for pid in pids]
    assert len(argvs) == 3
    for argv in argvs:                                 # tokenizer, inference and gateway each got it
        assert argv[argv.index(b"--busy-poll-us") + 1] == b"1000", argv


@pytest.mark.parametrize("flag,value", [("--max-batch-rows", "0"), ("--max-batch-tokens", "0"), ("--max-loaded", "0"),
                                        ("--tokenizer-workers", "-1"), ("--gateway-workers", "-2"),
                                        ("--busy-poll-us", "-5"), ("--max-batch-rows", "many")])
def test_serve_refuses_counts_out_of_range_at_parse_time(flag, value, capsys):
    """A count that would leave nothing to run with (0 rows a batch, 0 resident checkpoints) or a negative
    one is refused by name before anything starts, instead of hanging or failing later."""
    from laya_grpc.serve import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args([flag, value])
    assert flag in capsys.readouterr().err
