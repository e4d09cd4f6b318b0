"""Cold start of `laya-grpc serve`: process to ready with an empty GPU kernel cache and with a
filled one, for this tree (B) and a previous release (A, a tree at --base), and what
`laya-grpc warm-kernels` costs; then the first requests after ready.

Per round, one after the other on the same checkpoint and GPU (each stack alone; A and B swap
places every other round):
  A empty        A's serve with an empty Triton cache (TRITON_CACHE_DIR: a new directory)
  B empty        B's serve with an empty kernel cache (LAYA_KERNEL_CACHE_DIR: a new directory)
  B warm-kernels `laya-grpc warm-kernels` into another new directory (what an image build runs)
  B image cache  B's serve on the directory warm-kernels filled (a replica of the cuda-warm image)
  A restart      A's serve again on the cache its first start filled
  B restart      B's serve again on the cache its first start filled
Process to ready is wall time from starting `serve` to its `laya-grpc: ready` line (every gateway
worker SERVING, every checkpoint warm), including the interpreter's start and imports. Every
package's bytecode is compiled and the CUDA libraries read once beforehand (cold_start.sh: an image
carries bytecode, and both trees load the same libraries), and each serve gets a new CUDA driver
cache (CUDA_CACHE_PATH), so only the kernel cache differs between the cases. After ready:
the first short request, the first 512-token one, then 20 short ones (p50). The kernel count of
the cache before and after each start says whether a start still compiled anything.

    python -m benchmarks.cold_start --base .ab/base --out DIR [--rounds 2] [--preset large]

Writes cold_start.jsonl (one record per run) and cold_start.md (the table) to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchmarks.model_speed import Out
from laya_grpc.bench.inputs import named_cases
from laya_grpc.bench.service import READY_LINE
from laya_grpc.inference import kernel_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the service's own timing lines: torch imported, device init, load, kernel compiles, graph capture, warm-up,
# kernel cache, ready
TIMING_LINE = re.compile(r"torch CPU threads|initialised in|loaded .* in|kernel variants|captured \d+ CUDA graphs|ready on|"
                         r"kernel cache|laya-grpc: ready")
READY_IN = re.compile(r"laya-grpc: ready in ([0-9.]+) s")
CACHE_VARS = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH")
TARGETS = {"B empty": 8.0, "B image cache": 5.0}   # process to ready, seconds (the GPU engine's targets)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_env(tree: str, site: str, extra: dict) -> dict:
    """This environment less every LAYA_ and cache variable, with `tree` first on the path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_") and k not in CACHE_VARS}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (site, tree, os.path.join(tree, "protos", "gen")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def cache_env(side: str, cache: str) -> dict:
    """B takes the kernel cache setting; A (which predates it) Triton's own variable."""
    if side == "B":
        return {"LAYA_KERNEL_CACHE_DIR": cache}
    return {"TRITON_CACHE_DIR": os.path.join(cache, "triton")}


def kernels_in(cache: str) -> int:
    return kernel_cache.contents(os.path.join(cache, "triton")).kernels


def post(url: str, body: bytes) -> float:
    req = urllib.request.Request(url + "/v1/systemone", data=body, headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()
        if r.status != 200:
            raise RuntimeError("HTTP %d" % r.status)
    return (time.perf_counter() - t) * 1e3


def bodies() -> dict:
    cases = {c.name: c for c in named_cases()}
    return {name: json.dumps({"state": cases[name].state, "questions": cases[name].questions,
                              "model": "english"}).encode() for name in ("short", "t512")}


def serve_once(a, side: str, tree: str, cache: str, label: str, rnd: int, rec) -> dict:
    http, grpc_port = _free_port(), _free_port()
    run_dir = tempfile.mkdtemp(prefix="cold-%s-" % side)
    argv = [sys.executable, "-m", "laya_grpc.cli", "serve", "--checkpoint", "english=" + a.ckpt,
            "--http", "127.0.0.1:%d" % http, "--grpc", "127.0.0.1:%d" % grpc_port, "--run-dir", run_dir]
    argv += a.serve_args.split()
    env = tree_env(tree, a.site, dict(cache_env(side, cache), CUDA_CACHE_PATH=os.path.join(run_dir, "nv")))
    before = kernels_in(cache)
    log_path = os.path.join(run_dir, "serve.log")
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            ready_s = None
            deadline = time.monotonic() + a.ready_timeout
            while time.monotonic() < deadline and proc.poll() is None:
                with open(log_path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                if READY_LINE in text:
                    ready_s = time.perf_counter() - t0
                    break
                time.sleep(0.01)
            if ready_s is None:
                with open(log_path, "rb") as f:
                    text = f.read().decode("utf-8", "replace")
                raise RuntimeError("%s %s: not ready (exit %s):\n%s" % (side, label, proc.poll(), text[-3000:]))
            url, b = "http://127.0.0.1:%d" % http, bodies()
            first_short = post(url, b["short"])
            first_long = post(url, b["t512"])
            warm = [post(url, b["short"]) for _ in range(20)]
        finally:
            _stop(proc)
    with open(log_path, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    shutil.rmtree(run_dir, ignore_errors=True)
    m = READY_IN.search(text)
    return rec("serve", side=side, case=label, round=rnd, process_to_ready_s=round(ready_s, 3),
               serve_ready_in_s=float(m.group(1)) if m else None, first_short_ms=round(first_short, 2),
               first_t512_ms=round(first_long, 2), warm_short_p50_ms=round(statistics.median(warm), 2),
               kernels_before=before, kernels_after=kernels_in(cache),
               timing_lines=[ln[-200:] for ln in text.splitlines() if TIMING_LINE.search(ln)][-16:])


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to serve (it drains and stops its children), then the whole group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)   # any child left behind
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def warm_kernels(a, cache: str, rnd: int, rec) -> dict:
    argv = [sys.executable, "-m", "laya_grpc.cli", "warm-kernels", "--checkpoint", "english=" + a.ckpt,
            "--kernel-cache-dir", cache] + a.warm_args.split()
    env = tree_env(ROOT, a.site, {"CUDA_CACHE_PATH": os.path.join(cache, "nv-unused")})
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=a.ready_timeout)
    wall = time.perf_counter() - t0
    shutil.rmtree(os.path.join(cache, "nv-unused"), ignore_errors=True)
    if r.returncode != 0:
        raise RuntimeError("warm-kernels failed (%d):\n%s\n%s" % (r.returncode, r.stdout[-2000:], r.stderr[-2000:]))
    return rec("warm_kernels", round=rnd, wall_s=round(wall, 3), kernels=kernels_in(cache),
               output=r.stdout.strip().splitlines()[-4:])


def summary(records: list, budget_note: str) -> str:
    serves = [r for r in records if r["kind"] == "serve"]
    order = ["A empty", "B empty", "B image cache", "A restart", "B restart"]
    devices = sorted({m.group(1) for r in serves for ln in r["timing_lines"]
                      if (m := re.search(r"ready on (\S+?) ", ln))})
    lines = ["# Cold start: process to ready (`laya-grpc serve`, one checkpoint)", "",
             "Served on: %s." % (", ".join(devices) or "unknown"), "",
             "Median over rounds (each value: min-max). Compiled at start: kernels the cache gained "
             "during that start.", "",
             "| case | rounds | process to ready s | serve's own 'ready in' s | first short ms | "
             "first 512-token ms | warm short p50 ms | compiled at start |", "|---|---|---|---|---|---|---|---|"]
    for case in order:
        rs = [r for r in serves if "%s %s" % (r["side"], r["case"]) == case]
        if not rs:
            continue

        def col(key, fmt="%.2f"):
            vals = [r[key] for r in rs if r[key] is not None]
            if not vals:
                return "-"
            return (fmt % statistics.median(vals)) + (" (%s-%s)" % (fmt % min(vals), fmt % max(vals)) if len(vals) > 1 else "")
        compiled = ",".join(str(r["kernels_after"] - r["kernels_before"]) for r in rs)
        lines.append("| %s | %d | %s | %s | %s | %s | %s | %s |" % (
            case, len(rs), col("process_to_ready_s"), col("serve_ready_in_s", "%.1f"), col("first_short_ms"),
            col("first_t512_ms"), col("warm_short_p50_ms"), compiled))
    wk = [r for r in records if r["kind"] == "warm_kernels"]
    if wk:
        lines += ["", "`laya-grpc warm-kernels` (fresh directory): %s s wall, %s kernels" % (
            ", ".join("%.1f" % r["wall_s"] for r in wk), ", ".join(str(r["kernels"]) for r in wk))]
    lines += ["", "Targets (B): " + "; ".join(
        "%s <= %.0f s: %s" % (case, limit, _verdict([r["process_to_ready_s"] for r in serves
                                                    if "%s %s" % (r["side"], r["case"]) == case], limit))
        for case, limit in TARGETS.items())]
    if budget_note:
        lines += ["", budget_note]
    return "\n".join(lines) + "\n"


def _verdict(vals: list, limit: float) -> str:
    if not vals:
        return "not measured"
    m = statistics.median(vals)
    return "%s (median %.2f s)" % ("met" if m <= limit else "missed", m)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="tree of the previous release (laya_grpc, protos)")
    p.add_argument("--out", required=True)
    p.add_argument("--ckpt", default="/tmp/lb/large", help="checkpoint directory (made with --preset when missing)")
    p.add_argument("--preset", default="large")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--site", default="", help="directory of installed wheels, first on every child's path")
    p.add_argument("--serve-args", default="", help="extra flags for both stacks' serve (e.g. --device cpu)")
    p.add_argument("--warm-args", default="--require-device cuda", help="extra flags for warm-kernels")
    p.add_argument("--ready-timeout", type=float, default=180.0)
    p.add_argument("--budget-s", type=float, default=420.0, help="start no run after this many seconds")
    a = p.parse_args(argv)
    a.base = os.path.abspath(a.base)
    os.makedirs(a.out, exist_ok=True)
    rec_out = Out(os.path.join(a.out, "cold_start.jsonl"))
    records: list = []

    def rec(kind, **kw):
        r = rec_out(kind, **kw)
        records.append(r)
        with open(os.path.join(a.out, "cold_start.md"), "w") as f:   # kept current: a kill leaves the table
            f.write(summary(records, "(incomplete: written after each run)"))
        return r

    t_start = time.monotonic()
    if not os.path.exists(os.path.join(a.ckpt, "model.safetensors")):
        from laya_grpc.cli.make_checkpoint import make_checkpoint
        t = time.perf_counter()
        make_checkpoint(a.ckpt, a.preset)
        rec("make_checkpoint", preset=a.preset, s=round(time.perf_counter() - t, 2))
    work = tempfile.mkdtemp(prefix="cold-start-")
    skipped = []
    for rnd in range(a.rounds):
        caches = {k: os.path.join(work, "r%d-%s" % (rnd, k)) for k in ("a", "b", "wk")}
        empty = [("A", "empty", a.base, caches["a"]), ("B", "empty", ROOT, caches["b"])]
        restart = [("A", "restart", a.base, caches["a"]), ("B", "restart", ROOT, caches["b"])]
        if rnd % 2:   # every other round B goes first, so neither side always starts after the other
            empty, restart = empty[::-1], restart[::-1]
        plan = empty + [("warm", None, ROOT, caches["wk"]), ("B", "image cache", ROOT, caches["wk"])] + restart
        warmed = False
        for side, label, tree, cache in plan:
            if time.monotonic() - t_start > a.budget_s:
                skipped.append("round %d: %s" % (rnd, "warm-kernels" if side == "warm" else side + " " + label))
                continue
            if label == "image cache" and not warmed:
                continue   # warm-kernels failed (its error is recorded): nothing to start from
            try:
                if side == "warm":
                    warm_kernels(a, cache, rnd, rec)
                    warmed = True
                else:
                    serve_once(a, side, tree, cache, label, rnd, rec)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                rec("error", round=rnd, side=side, case=label, error=str(e)[-3000:])
    shutil.rmtree(work, ignore_errors=True)
    note = ("Not run (time budget of %.0f s): %s" % (a.budget_s, "; ".join(skipped))) if skipped else ""
    text = summary(records, note)
    with open(os.path.join(a.out, "cold_start.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if any(r["kind"] == "error" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
