"""Where an inference process's start-up goes on CUDA, phase by phase, and what three ways of capturing
the warm set's graphs cost, each in a fresh process with an empty and then a filled Triton cache.

Phases, in one process: `import torch`; the CUDA context (`init_device`); the checkpoint load
(`TorchRunner`); the capture of every bucket of the warm set. The capture runs one of three ways:
  inline    each bucket as a request would capture it (`GraphCache.get`): an eager pass that
            compiles each Triton kernel variant when it first reaches it, then the capture
  ahead     `TorchRunner.warm`: every bucket's dry pass first, compiling the variants side by side
            (inference/kernel_compile.py), then each bucket's capture, without an eager pass (the
            dry pass compiled and loaded the kernels and set up what the eager pass is there for)
  eager     the dry passes as `ahead`, then an eager pass before each capture as well (what a
            bucket captured on demand, outside the warm set, runs): the cost of that eager pass
After the capture: three synthetic batches (1, 8 and 40 rows), each through its bucket's graph, against
the same step run eagerly on the same buffers (max |difference|, expected 0), and the kernel files in the
cache. Also `python -X importtime -c "import torch"`: the slowest imports.

    python -m benchmarks.startup_phases --ckpt /tmp/lb/large --out DIR [--dtype float32]

Writes startup_phases.jsonl and startup_phases.md to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

MODES = ("inline", "ahead", "eager")


def child(a) -> dict:
    t0 = time.perf_counter()
    import torch
    t_torch = time.perf_counter()
    from laya_grpc.inference import cuda_graphs, kernel_cache, kernel_compile
    from laya_grpc.inference.devices import init_device
    from laya_grpc.inference.registry import synthetic_rows
    from laya_grpc.inference.torch_runner import TorchRunner
    init_device("cuda:0", "torch")
    t_ctx = time.perf_counter()
    runner = TorchRunner(a.ckpt, "cuda:0", a.dtype)
    torch.cuda.synchronize()
    t_load = time.perf_counter()
    g, dev = runner.graphs, torch.device("cuda:0")
    buckets = runner.packing.warm_buckets()
    rec = {"mode": a.child, "buckets": len(buckets), "import_torch_s": t_torch - t0, "context_s": t_ctx - t_torch,
           "load_s": t_load - t_ctx}
    if a.child == "inline":
        t1 = time.perf_counter()
        g.cache.get(buckets[0])
        rec["first_capture_s"] = time.perf_counter() - t1
        for b in buckets[1:]:
            g.cache.get(b)
    elif a.child == "ahead":
        real = kernel_compile.ahead

        def timed(steps, device):
            t = time.perf_counter()
            n = real(steps, device)
            rec["ahead_s"], rec["variants"] = time.perf_counter() - t, n
            return n
        kernel_compile.ahead = timed
        g.warm(buckets)
    else:
        entries = {b: g._buffers(b) for b in buckets}
        stream = g._stream
        stream.wait_stream(torch.cuda.current_stream(dev))

        def dry(step):
            def run():
                with torch.inference_mode(), torch.cuda.stream(stream):
                    step()
            return run
        t = time.perf_counter()
        rec["variants"] = kernel_compile.ahead([dry(e.step) for e in entries.values()], dev)
        rec["ahead_s"] = time.perf_counter() - t
        torch.cuda.current_stream(dev).wait_stream(stream)
        for b, e in entries.items():
            def capture(_b, e=e):
                e.graph = cuda_graphs.capture_graph(e.step, stream, g._pool, dev)
                return e
            g.cache.get(b, capture)
    torch.cuda.synchronize()
    rec["capture_total_s"] = time.perf_counter() - t_load
    rec["process_s"] = time.perf_counter() - t0
    diffs = []
    vocab = runner.vocab_size
    for n, tokens, markers in ((1, 60, 3), (8, 120, 4), (40, 300, 2)):
        rows = synthetic_rows(n, tokens, markers, vocab, seed=len(diffs))
        c = g.cache.get(g.plan.bucket(n, n * tokens, markers))
        g.forward(rows, 0)                       # the graph's replay: c.host_out
        graph_out = c.host_out.clone()
        with torch.inference_mode():
            c.step()                             # the same step, eagerly, on the same buffers
        eager_out = c.out.cpu()
        diffs.append(float((graph_out - eager_out).abs().nan_to_num(nan=float("inf")).max()))
    rec["graph_vs_eager_max_abs"] = max(diffs)
    rec["kernels_in_cache"] = kernel_cache.contents(kernel_cache.triton_dir()).kernels
    rec["graphs"] = len(g.cache)
    return rec


def run_child(mode: str, cache: str, a) -> dict:
    env = dict(os.environ, TRITON_CACHE_DIR=cache, CUDA_CACHE_PATH=tempfile.mkdtemp(prefix="cuda-cache-"))
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "benchmarks.startup_phases", "--child", mode, "--ckpt", a.ckpt,
                        "--dtype", a.dtype], env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "error": (p.stderr or p.stdout)[-1500:], "wall_s": wall}
    rec = json.loads(lines[-1])
    rec["wall_s"] = wall
    rec["log"] = [ln[-180:] for ln in p.stderr.splitlines() if "compiled or read" in ln or "captured" in ln][-3:]
    return rec


def importtime(top: int = 15) -> list:
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import torch"], capture_output=True, text=True)
    rows = []
    for ln in p.stderr.splitlines():
        parts = ln.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return [{"cumulative_ms": us / 1e3, "module": m} for us, m in sorted(rows, reverse=True)[:top]]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", default=".")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--child", choices=MODES)
    a = ap.parse_args(argv)
    if a.child:
        import logging
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        print(json.dumps(child(a)), flush=True)
        return 0
    os.makedirs(a.out, exist_ok=True)
    from benchmarks.model_speed import ensure_large
    ensure_large(a.ckpt, lambda kind, **kw: print(json.dumps(dict(kind=kind, **kw)), flush=True))
    recs = []
    with open(os.path.join(a.out, "startup_phases.jsonl"), "w") as f:
        imp = importtime()
        f.write(json.dumps({"kind": "importtime", "top": imp}) + "\n")
        for mode in MODES:
            cache = tempfile.mkdtemp(prefix="triton-%s-" % mode)
            for case in ("empty", "filled"):
                rec = dict(run_child(mode, cache, a), case=case, kind="phases")
                recs.append(rec)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(json.dumps(rec), flush=True)
    cols = ("import_torch_s", "context_s", "load_s", "first_capture_s", "ahead_s", "capture_total_s", "process_s",
            "wall_s")
    md = ["# Inference start-up phases on CUDA (`benchmarks/startup_phases.py`, %s)" % a.dtype, "",
          "Seconds per phase, one fresh process each; `capture_total_s` is everything after the load (compiles "
          "included); `wall_s` includes the interpreter's start.", "",
          "| mode | cache | " + " | ".join(cols) + " | variants | kernels in cache | graph vs eager |",
          "|---|---|" + "---|" * (len(cols) + 3)]
    for r in recs:
        if "error" in r:
            md.append("| %s | %s | error: %s |" % (r["mode"], r["case"], r["error"].splitlines()[-1][:200]))
            continue
        md.append("| %s | %s | %s | %s | %s | %s |" % (
            r["mode"], r["case"], " | ".join("%.2f" % r[c] if c in r else "" for c in cols), r.get("variants", ""),
            r.get("kernels_in_cache", ""), r.get("graph_vs_eager_max_abs", "")))
    md += ["", "`import torch`, slowest imports (cumulative ms):", ""]
    md += ["- %.0f %s" % (r["cumulative_ms"], r["module"]) for r in imp]
    with open(os.path.join(a.out, "startup_phases.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
