"""Where the CUDA forward's time goes, and a request's time between processes: studies for one GPU call.

gemms: each encoder GEMM shape of the checkpoint alone (cuBLAS through torch.mm), at the token
  counts of one short row, 64 and 256 short rows: microseconds and TFLOP/s with a 16-bit and with
  a float32 result (the served Wo GEMMs). Says how far the forward's GEMMs are from what cuBLAS
  gives these shapes; at one row's 160 tokens the back-to-back calls are bound by Python's launch
  cost (~25 us a torch.mm), so only the larger counts measure the GPU.
kernels: the fused encoder's forward run eagerly under torch.profiler (CUDA kernel times are the
  same as inside the graph; only the launch gaps differ), summed per kernel name per forward,
  next to the CUDA-graph replay time of the same buckets, per layout (--layouts): packed, the
  forward serving runs, and padded, the one parallel option layouts run. Says which kernels to
  attack next, and counts them.
hops: `serve` with the default workers and with one gateway and one tokenizer, each without and
  with busy-polling event loops (LAYA_BUSY_POLL_US), each timed per hop by benchmarks/stack_hops.py (tokenizer RPC, inference
  RPC, gRPC Decide, HTTP).

Start-up (process to ready with an empty and a filled kernel cache) is benchmarks/cold_start.py's.

`python -m benchmarks.gpu_profile --ckpt DIR --out DIR [--studies kernels,hops,gemms]`; makes the
`large` checkpoint in DIR when it is missing. Writes gpu_profile.jsonl; prints tables last.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys

from benchmarks.model_speed import Out, ensure_large, replay_ms, rows

SHAPES = ((1, 132, 3), (1, 512, 5), (6, 132, 4), (64, 132, 3), (256, 132, 3))


def kernel_study(a, rec) -> list:
    import torch
    from laya_grpc.inference.torch_model import LayaTorch
    model = LayaTorch.from_checkpoint(a.ckpt, "cuda", getattr(torch, a.dtype))
    model.use_fused_kernels()
    tables = []
    for layout in a.layouts.split(","):
        study = LAYOUTS[layout]
        for s in SHAPES:
            batch = rows([s[1]] * s[0], s[2], model.spec.vocab_size, seed=s[0])
            steps, buckets, replay, close = study(torch, model, batch, s)
            per, iters = _profile(torch, steps)
            total = sum(v[0] for v in per.values())
            top = sorted(per.items(), key=lambda kv: -kv[1][0])[:18]
            tables.append(rec("kernels", dtype=a.dtype, layout=layout, rows=s[0], tokens=s[1], buckets=buckets,
                              replay_ms=replay, kernel_sum_ms=total / 1e3,
                              launches_per_forward=sum(v[1] for v in per.values()) / iters,
                              top=[{"name": n[:90], "us": round(v[0], 2), "per_fwd": v[1] / iters} for n, v in top]))
            close()
    model = None
    torch.cuda.empty_cache()
    return tables


def _padded_steps(torch, model, batch, s):
    """The padded forward (parallel option layouts, `--pack-rows off`): one CUDA-graph bucket."""
    from laya_grpc.inference.cuda_graphs import BucketPlan, CudaGraphForward, field_views
    plan = BucketPlan(max_rows=256, max_tokens=512)
    gf = CudaGraphForward(model, torch.device("cuda:0"), plan, parallel=False)
    bk = plan.bucket(*s)
    gf.forward(batch)
    replay = replay_ms(torch, gf.cache.get(bk).graph, 100)
    # the same padded batch (what the graph's input buffer now holds), eagerly, under the profiler
    t = field_views(gf.cache.get(bk).dev_in, bk, False)
    step = lambda: model(t["input_ids"], t["attention_mask"], t["marker_pos"], t["marker_mask"], t["qtype"])
    return [step], [[bk.rows, bk.tokens]], replay, gf.close


def _packed_steps(torch, model, batch, s):
    """The packed forward, what serving runs: the batch split as the served plan splits it (16,384
    tokens a forward), each part one packed bucket; replay_ms sums the parts' graph replays."""
    from laya_grpc.inference.cuda_graphs import PackedForward
    from laya_grpc.inference.packing import PackedPlan, rows_from_padded
    try:
        from laya_grpc.inference.cuda_graphs import packed_plan
        plan = packed_plan(256, 512, 16384, model.encoder.embeddings.tok_embeddings.weight.dtype)
    except ImportError:   # an A tree (device_run.sh A_DIR) from before per-bucket query blocks: its served plan
        plan = PackedPlan(max_rows=256, max_row_tokens=512, max_batch_tokens=16384)
    pf = PackedForward(model, torch.device("cuda:0"), plan)
    steps, buckets, replay = [], [], 0.0
    packed = rows_from_padded(batch)
    for index in plan.split(packed):
        part = packed.take(index)
        pf.forward(part, 0)                       # captures the bucket and leaves this part in its buffers
        n = part.n
        bk = plan.bucket(n, len(part.ids), int(part.marker_counts.max()))
        entry = pf.cache.get(bk)
        replay += replay_ms(torch, entry.graph, 100)
        steps.append(entry.step)
        buckets.append([bk.segments, bk.tokens])
    return steps, buckets, replay, pf.close


LAYOUTS = {"packed": _packed_steps, "padded": _padded_steps}


def _profile(torch, steps):
    """GPU time per kernel name over one forward (all of `steps`), eagerly under torch.profiler
    (CUDA kernel times equal the graph's; only the launch gaps differ)."""
    from torch.profiler import ProfilerActivity, profile
    call = lambda: [step() for step in steps]
    with torch.inference_mode():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        iters = 5
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                call()
            torch.cuda.synchronize()
    per = collections.defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type.name == "CUDA":   # kernel and memcpy records: their GPU intervals
            per[e.name][0] += e.time_range.elapsed_us() / iters
            per[e.name][1] += 1
    return per, iters


def hops_study(a, rec, cache: str | None) -> list:
    """Per-hop latency (benchmarks/stack_hops.py) of a served stack, per serve configuration."""
    import subprocess
    from laya_grpc.bench.service import Served
    env = {"LAYA_MAX_CONCURRENT": "256"}
    if cache:
        env["TRITON_CACHE_DIR"] = cache
    out = []
    one = ["--gateway-workers", "1", "--tokenizer-workers", "1"]
    for label, extra, more_env in (("default workers, streamed internal calls", [], {}),
                                   ("default workers, streamed, busy-poll 2000 us", [], {"LAYA_BUSY_POLL_US": "2000"}),
                                   ("1 gateway, 1 tokenizer, streamed", one, {}),
                                   ("1 gateway, 1 tokenizer, streamed, busy-poll 2000 us", one,
                                    {"LAYA_BUSY_POLL_US": "2000"})):
        srv = Served({"english": a.ckpt}, extra, dict(env, **more_env))
        try:
            ready_s = srv.wait_ready(300)
            cmd = [sys.executable, "-m", "benchmarks.stack_hops", "--run-dir", srv.run_dir, "--http",
                   "127.0.0.1:%d" % srv.http_port, "--grpc", srv.grpc, "-n", str(a.hops_n), "--json"]
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            hops = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else {"error": res.stderr[-2000:]}
            out.append(rec("hops", config=label, extra=extra, process_to_ready_s=ready_s, hops=hops))
        finally:
            srv.close()
    return out


GEMM_TOKENS = (160, 9216, 36864)   # one short row's bucket; 64 and 256 short rows packed


def gemm_study(a, rec) -> list:
    import torch
    from laya_grpc.core.checkpoints.model_shape import read_model_shape
    spec = read_model_shape(a.ckpt)
    d, inter = spec.hidden_size, spec.intermediate_size
    shapes = (("Wqkv", 3 * d, d), ("attn.Wo", d, d), ("mlp.Wi", 2 * inter, d), ("mlp.Wo", d, inter))
    out = []
    for m in GEMM_TOKENS:
        for name, n, k in shapes:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            w = torch.randn(n, k, device="cuda", dtype=torch.float16) * 0.02
            for res in ("float16", "float32"):
                fn = (lambda: torch.mm(x, w.t())) if res == "float16" else \
                    (lambda: torch.mm(x, w.t(), out_dtype=torch.float32))
                for _ in range(5):
                    fn()
                iters = 200 if m < 10000 else 40
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                for _ in range(iters):
                    fn()
                e.record()
                torch.cuda.synchronize()
                us = s.elapsed_time(e) / iters * 1e3
                out.append(rec("gemm", gemm=name, m=m, n=n, k=k, result=res, us=round(us, 2),
                               tflops=round(2.0 * m * n * k / us / 1e6, 1)))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_profile")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--studies", default="kernels", help="comma list of hops, kernels, gemms")
    p.add_argument("--layouts", default="packed",
                   help="the kernel study's forwards: packed (what serving runs), padded (parallel option layouts)")
    p.add_argument("--hops-n", type=int, default=300, help="sequential requests per hop in the hops study")
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32",
                   help="the kernel study's weights: float32 is the exact mode `--dtype auto` serves on CUDA, "
                        "float16 the fast mode")
    a = p.parse_args(argv)
    if set(a.layouts.split(",")) - set(LAYOUTS):
        p.error("--layouts: a comma list of %s" % ", ".join(LAYOUTS))
    os.makedirs(a.out, exist_ok=True)
    rec = Out(os.path.join(a.out, "gpu_profile.jsonl"))
    ensure_large(a.ckpt, rec)
    studies = a.studies.split(",")
    kernels = hops = []
    if "hops" in studies:
        try:
            hops = hops_study(a, rec, os.environ.get("TRITON_CACHE_DIR"))
        except Exception as e:  # noqa: BLE001 - a failed study is a finding; the others still run
            rec("error", study="hops", error=repr(e)[:2000])
    if "kernels" in studies:
        try:
            kernels = kernel_study(a, rec)
        except Exception as e:  # noqa: BLE001
            rec("error", study="kernels", error=repr(e)[:2000])
    gemms = []
    if "gemms" in studies:
        try:
            gemms = gemm_study(a, rec)
        except Exception as e:  # noqa: BLE001
            rec("error", study="gemms", error=repr(e)[:2000])
    for r in gemms:
        print("gemm %-8s M=%-6d N=%-5d K=%-5d %s out: %8.1f us %6.1f TFLOP/s"
              % (r["gemm"], r["m"], r["n"], r["k"], r["result"], r["us"], r["tflops"]))
    for r in kernels:
        print("\n%s %s %dx%d (buckets %s): graph replay %.3f ms, kernels %.3f ms, %d launches"
              % (r["dtype"], r["layout"], r["rows"], r["tokens"], r["buckets"], r["replay_ms"], r["kernel_sum_ms"],
                 r["launches_per_forward"]))
        for k in r["top"]:
            print("  %8.1f us %5.0f x  %s" % (k["us"], k["per_fwd"], k["name"]))
    for r in hops:
        print("\n[hops: %s] ready %.1f s" % (r["config"], r["process_to_ready_s"]))
        for k, v in r["hops"].items():
            print("   %-26s %s" % (k, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
