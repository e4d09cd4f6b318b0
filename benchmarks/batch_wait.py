"""Does waiting a little longer before a forward raise decisions/s at 64 clients? One stack per
`--max-wait-ms` value, all serving the same checkpoint on one GPU at once, each loaded alone in
turn (the order rotates every round), so every value sees the same host and device.

Per stack and round: decisions/s, p50 and p95 of the closed-loop HTTP clients, and from the
stack's own Prometheus families over the round: rows per forward (laya_inference_batch_rows),
and forwards per second and the device's busy share (laya_inference_forward_seconds), both over
the round's --load-s seconds (the load's client processes start a little before and end a little
after them, so the busy share can pass 1.0). `--max-wait-ms` waits whenever the device thread
takes a request with nothing queued behind it, at idle too; with the device busy, a larger value
gathers more rows into the next forward at the price of that wait.

    python -m benchmarks.batch_wait --ckpt DIR [--waits 0,1,2,4] [--clients 64] [--load-s 5] [--rounds 2]

Prints one JSON line per stack and round, then a table of medians over rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

FAMILIES = ("laya_inference_batch_rows", "laya_inference_forward_seconds")


def scrape(port: int) -> dict:
    """Sample name (`..._sum`, `..._count`) -> value summed over labels, for the two inference families."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name in FAMILIES:
            for s in fam.samples:
                if s.name.endswith(("_sum", "_count")):
                    out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def main(argv=None) -> int:
    from laya_grpc.bench.inputs import named_cases
    from laya_grpc.bench.service import Served, _free_port, load

    p = argparse.ArgumentParser(prog="python -m benchmarks.batch_wait", description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, help="checkpoint directory, served as english")
    p.add_argument("--waits", default="0,1,2,4", help="comma list of --max-wait-ms values, one stack each")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--load-s", type=float, default=5.0, help="seconds of load per stack and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--extra", default="", help="more `serve` flags for every stack (e.g. '--dtype float16')")
    a = p.parse_args(argv)
    waits = [float(w) for w in a.waits.split(",") if w]
    case = named_cases()[0]
    stacks = {}
    try:
        for w in waits:
            port = _free_port()
            stacks[w] = (Served({"english": a.ckpt}, ["--metrics", "127.0.0.1:%d" % port] + a.extra.split(),
                                {"LAYA_MAX_WAIT_MS": str(w)}), port)
        for w, (s, _) in stacks.items():
            print("max-wait-ms %g ready in %.1f s" % (w, s.wait_ready(300)), flush=True)
        for w, (s, _) in stacks.items():   # a short load each: every bucket's graph replayed once before timing
            load("http", s.http, [case], "english", a.clients, 1.0, procs=min(8, a.clients))
        rows = []
        for rnd in range(a.rounds):
            order = waits[rnd % len(waits):] + waits[:rnd % len(waits)]
            for w in order:
                s, port = stacks[w]
                before = scrape(port)
                r = load("http", s.http, [case], "english", a.clients, a.load_s, procs=min(8, a.clients))
                after = scrape(port)
                d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                fwd = d.get("laya_inference_batch_rows_count", 0.0)
                rec = {"kind": "batch_wait", "max_wait_ms": w, "round": rnd, "clients": a.clients,
                       "decisions_per_s": r["decisions_per_s"], "p50_ms": r["p50_ms"], "p95_ms": r["p95_ms"],
                       "codes": r["codes"], "rows_per_forward": d.get("laya_inference_batch_rows_sum", 0.0) / max(fwd, 1),
                       "forwards_per_s": fwd / a.load_s,
                       "device_busy": d.get("laya_inference_forward_seconds_sum", 0.0) / a.load_s}
                rows.append(rec)
                print(json.dumps(rec), flush=True)
    finally:
        for s, _ in stacks.values():
            s.close()
    print("\n| max-wait-ms | decisions/s | p50 ms | p95 ms | rows/forward | forwards/s | device busy |")
    print("|---|---|---|---|---|---|---|")
    for w in waits:
        mine = [r for r in rows if r["max_wait_ms"] == w]
        med = {k: statistics.median(r[k] for r in mine) for k in
               ("decisions_per_s", "p50_ms", "p95_ms", "rows_per_forward", "forwards_per_s", "device_busy")}
        print("| %g | %.0f | %.1f | %.1f | %.1f | %.0f | %.2f |" % (w, med["decisions_per_s"], med["p50_ms"],
              med["p95_ms"], med["rows_per_forward"], med["forwards_per_s"], med["device_busy"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
