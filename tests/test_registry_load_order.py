"""A checkpoint's load: the weights' sha256 runs beside the load and the warm-up, not before the
warm-up (it is wanted by READY only), and a digest that fails after a good load leaves the slot
FAILED with its runner closed. The registry with a real CPU runner and the real batcher's device
thread; only the digest is slowed or broken, as a slow CPU or an unreadable file would."""
from __future__ import annotations

import asyncio
import time

import laya_grpc.inference.registry as registry
from laya_grpc.inference.batcher import Batcher
from laya_grpc.inference.devices import pick_device
from laya_grpc.inference.registry import Registry, S


def _run(ckpt, body):
    async def main():
        batcher = Batcher(lambda name: reg.ready_runner(name), lambda name: reg.slots[name].pad_id)
        batcher.start()
        reg = Registry({"a": ckpt}, "torch", pick_device("cpu", "torch", True), "auto", 1, True,
                       batcher.run_on_device, lambda: None)
        try:
            return await body(reg)
        finally:
            s = reg.slots["a"]
            if s.runner is not None:
                await batcher.run_on_device(s.runner.close)
            batcher.stop()
    return asyncio.run(main())


def test_the_warm_up_starts_before_the_weights_digest_ends(tiny_ckpt, monkeypatch):
    marks = {}
    digests, warm = registry._digests, registry.warm_runner

    def slow_digests(ckpt):
        time.sleep(1.0)   # 842 MB at 0.8 GB/s, a CPU without sha256 instructions
        marks["digested"] = time.perf_counter()
        return digests(ckpt)

    def timed_warm(runner, ckpt, pad_id):
        marks["warm"] = time.perf_counter()
        warm(runner, ckpt, pad_id)

    monkeypatch.setattr(registry, "_digests", slow_digests)
    monkeypatch.setattr(registry, "warm_runner", timed_warm)

    async def body(reg):
        s = await reg.ensure("a")
        return s.state, s.sha256, s.ckpt.sha256

    state, sha, expected = _run(tiny_ckpt, body)
    assert state == S.STATE_READY
    assert sha == expected and len(sha) == 64
    assert marks["warm"] < marks["digested"] - 0.5, marks


def test_a_digest_failing_after_a_good_load_closes_the_runner(tiny_ckpt, monkeypatch):
    runners = []
    load = registry.load_runner

    def broken_digests(ckpt):
        time.sleep(0.2)
        raise OSError("model.safetensors: Input/output error")

    def kept_load(*args, **kwargs):
        runners.append(load(*args, **kwargs))
        return runners[-1]

    monkeypatch.setattr(registry, "_digests", broken_digests)
    monkeypatch.setattr(registry, "load_runner", kept_load)

    async def body(reg):
        try:
            await reg.ensure("a")
        except Exception as e:  # noqa: BLE001 - the failure is what this test reads
            s = reg.slots["a"]
            return s.state, s.runner, str(e)
        raise AssertionError("the load succeeded with an unreadable file")

    state, runner, err = _run(tiny_ckpt, body)
    assert state == S.STATE_FAILED and runner is None
    assert "Input/output error" in err
    assert len(runners) == 1 and not hasattr(runners[0], "model")   # TorchRunner.close dropped the model
