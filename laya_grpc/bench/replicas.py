"""Inference replicas sharing ONE device: `serve --inference-replicas N` for each N, HTTP load side by side.

One replica alternates host work (unpacking a batch, building the next one, numpy out) with the
device's forward; a second replica on the same device can run its forward while the first does
its host work, at the price of a second copy of the weights. Whether that pays depends on the
device and the load, so it is measured: decisions/s and p95 per (replicas, clients), GPU memory
per process where nvidia-smi answers. The stacks run one at a time: two at once would share the
device and each would measure the other.
"""
from __future__ import annotations

import os

from .inputs import named_cases
from .service import Served, gpu_used_by_pids, load


def run_replicas(a, rec, ckpt: str, model: str) -> bool:
    """One record (kind "replicas") per (replicas, clients); False when a stack failed or a
    request got an error status."""
    cases = [named_cases()[0]]   # the short one-question request, as the service stage's concurrency figures
    env = {"LAYA_MAX_CONCURRENT": str(a.max_concurrent)}
    ok = True
    for n in a.replicas:
        extra = ["--backend", a.backend, "--dtype", a.dtype, "--device", a.device,
                 "--inference-replicas", str(n)]
        s = Served({model: ckpt}, extra, env)
        try:
            ready_s = s.wait_ready(a.ready_timeout)
            # warm-up: every replica's batch shapes at the largest load measured, none of it recorded
            load("http", s.http, cases, model, max(a.replica_clients), min(a.duration, 2.0),
                 procs=min(max(a.replica_clients), a.client_procs))
            for clients in a.replica_clients:
                r = load("http", s.http, cases, model, clients, a.duration, procs=min(clients, a.client_procs))
                errors = sum(v for k, v in r["codes"].items() if k != "200")
                pids = {c["pid"] for c in s.children()}
                rec("http", "replicas", replicas=n, inference_processes=_inference_sockets(s.run_dir),
                    clients=clients, decisions_per_s=r["decisions_per_s"],
                    req_per_s=r["req_per_s"], p50_ms=r["p50_ms"], p95_ms=r["p95_ms"], requests=r["requests"],
                    errors=errors, codes=r["codes"], process_to_ready_s=ready_s,
                    gpu_mb_by_pid={p: mb for p, mb in gpu_used_by_pids().items() if p in pids})
                ok = ok and errors == 0
        except Exception as e:  # noqa: BLE001 - recorded in the results and the exit code; the next N still runs
            rec("replicas", "error", replicas=n, detail="%s: %s" % (type(e).__name__, e))
            ok = False
        finally:
            s.close()
    return ok


def _inference_sockets(run_dir: str) -> int:
    """Inference processes serve started: one gRPC socket each in its run dir (inference.sock, or
    inference-K.sock with several replicas), so the record shows N was really N."""
    return sum(1 for f in os.listdir(run_dir) if f.startswith("inference") and f.endswith(".sock"))
