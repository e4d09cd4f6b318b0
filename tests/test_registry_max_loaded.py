"""--max-loaded holds while several checkpoints load at once: the registry with real CPU runners
and the real batcher's device thread, checkpoints requested concurrently from cold. Counted at every
state change: never more checkpoints holding (or loading) weights than the limit."""
from __future__ import annotations

import asyncio

from laya_grpc.inference.batcher import Batcher
from laya_grpc.inference.devices import pick_device
from laya_grpc.inference.registry import Registry


def test_concurrent_loads_never_exceed_max_loaded(tiny_ckpt, tiny_ml_ckpt, tiny_par_ckpt):
    seen = []

    async def main():
        batcher = Batcher(lambda name: reg.ready_runner(name), lambda name: reg.slots[name].pad_id)
        batcher.start()

        def on_change():
            seen.append(sum(1 for s in reg.slots.values() if s.runner is not None))

        reg = Registry({"a": tiny_ckpt, "b": tiny_ml_ckpt, "c": tiny_par_ckpt}, "torch",
                       pick_device("cpu", "torch", True), "auto", 1, False, batcher.run_on_device, on_change)
        try:
            for _ in range(2):     # every checkpoint requested at once, twice over
                got = await asyncio.gather(*(reg.ensure(n) for n in ("a", "b", "c")))
                assert [s.name for s in got] == ["a", "b", "c"]
            return sum(1 for s in reg.slots.values() if s.runner is not None)
        finally:
            for s in reg.slots.values():
                if s.runner is not None:
                    await batcher.run_on_device(s.runner.close)
            batcher.stop()

    resident = asyncio.run(main())
    assert resident == 1
    assert seen and max(seen) <= 1, seen
