"""An inference process's warm-up on CUDA under cProfile: each bucket's dry pass timed, then the
warm-up's own Python by function.

`TorchRunner.warm` as the service runs it (dry passes through `kernel_compile.ahead`, then the
captures), in this process, with the Triton cache that TRITON_CACHE_DIR names; run it twice for a
filled cache. Each dry pass is timed to a device synchronisation (which the service does not do,
so the sum is an upper bound of their share). Prints the import-to-loaded time, the warm-up time,
each bucket's dry pass in ms, and the profile by own and by cumulative time (the main thread only:
the pool that reads and loads the kernel variants is not in it). `benchmarks/startup_phases.py`
times the phases in fresh processes instead, without a profiler.

    TRITON_CACHE_DIR=/tmp/c python3 -m benchmarks.warm_profile --ckpt /tmp/lb/large
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--dtype", default="float32")
    a = ap.parse_args()
    t0 = time.perf_counter()
    import torch

    from laya_grpc.inference import kernel_compile
    from laya_grpc.inference.devices import init_device
    from laya_grpc.inference.torch_runner import TorchRunner
    init_device("cuda:0", "torch")
    runner = TorchRunner(a.ckpt, "cuda:0", a.dtype)
    torch.cuda.synchronize()
    print("import, context and load: %.3f s" % (time.perf_counter() - t0))
    ahead, per = kernel_compile.ahead, []

    def timed(steps, device):
        def each(step):
            def run():
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
                per.append(time.perf_counter() - t)
            return run
        return ahead([each(s) for s in steps], device)

    kernel_compile.ahead = timed
    prof = cProfile.Profile()
    t1 = time.perf_counter()
    prof.enable()
    graphs = runner.warm()
    prof.disable()
    torch.cuda.synchronize()
    buckets = runner.packing.warm_buckets()
    print("warm-up %.3f s, %d graphs; dry passes (each to a sync) %.3f s" % (time.perf_counter() - t1, graphs, sum(per)))
    print("dry pass per bucket (tokens: ms):", " ".join("%d:%.1f" % (b.tokens, x * 1e3) for b, x in zip(buckets, per)))
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(30)
        print(s.getvalue())


if __name__ == "__main__":
    main()
