"""Two running stacks, one request each in turn: which is faster, and where, under the same host state.

Stacks measured one after the other see different host states (another machine start, a warmer
cache, a busier neighbour); a paired run alternates one short HTTP request to each (`x-laya-timing`
on), first A then B, then B then A, so both see the same conditions, and reports each stack's
p50/p95, the median per-pair time ratio A/B with a bootstrap 95% interval, and each stage of the
gateway's timing header per stack. `--load S` then runs closed-loop HTTP clients (`--clients`, 64 by
default) against each stack alone (the other idle) for S seconds, twice, alternating. `--batch N`
pairs `/v1/systemone/batch` requests of N copies of a bench input's state instead (`--case`).

    python -m benchmarks.paired_stacks 127.0.0.1:18301 127.0.0.1:18300 [-n 1000] [--load 8 --clients 8,64]

Used to compare two builds of the serving path (start one from a copy of the tree at the other
commit, on other ports); prints one JSON line per result.
"""
from __future__ import annotations

import argparse
import collections
import json

from laya_grpc.bench.hop_timing import TimedHTTP
from laya_grpc.bench.stats import paired_ratio, pct, summary_ms

BODY = {"model": "english", "state": "My phone arrived broken and I want my money back today.",
        "questions": {"angry": {"type": "noul", "instructions": "Is the customer angry?"}}}


def _post(conn: TimedHTTP) -> tuple:
    status, ms, stages = conn.post()
    if status != 200:
        raise RuntimeError("request failed with HTTP %d" % status)
    return ms, stages


def paired(a: str, b: str, n: int, warm: int = 50, body: dict = BODY, path: str = "/v1/systemone") -> dict:
    conns = {"a": TimedHTTP(a, body, path), "b": TimedHTTP(b, body, path)}
    for _ in range(warm):
        for c in conns.values():
            _post(c)
    t = {"a": [], "b": []}
    st = {"a": collections.defaultdict(list), "b": collections.defaultdict(list)}
    for i in range(n):
        for key in ("a", "b") if i % 2 == 0 else ("b", "a"):
            ms, stages = _post(conns[key])
            t[key].append(ms / 1e3)
            for k, v in stages.items():
                st[key][k].append(v)
    for c in conns.values():
        c.close()
    sa, sb, r = summary_ms(t["a"]), summary_ms(t["b"]), paired_ratio(t["a"], t["b"])
    return {"kind": "pair", "a": a, "b": b, "pairs": n,
            "a_p50": sa["p50_ms"], "a_p95": sa["p95_ms"], "b_p50": sb["p50_ms"], "b_p95": sb["p95_ms"],
            "ratio_median": r["median_ratio"], "ci": [r["ci95_lo"], r["ci95_hi"]],
            "a_stages": {k: pct(v, 50) for k, v in st["a"].items()},
            "b_stages": {k: pct(v, 50) for k, v in st["b"].items()}}


def paired_grpc(a: str, b: str, n: int, case, warm: int = 50) -> dict:
    """`paired` over gRPC: the same alternation, each side's `Decide` through one client."""
    import time

    from laya_grpc.client import LayaClient
    clients = {"a": LayaClient(a), "b": LayaClient(b)}
    t = {"a": [], "b": []}
    for i in range(warm + n):
        for key in ("a", "b") if i % 2 == 0 else ("b", "a"):
            t0 = time.perf_counter()
            clients[key].decide(case.state, case.questions, model="english")
            if i >= warm:
                t[key].append(time.perf_counter() - t0)
    for c in clients.values():
        c.close()
    sa, sb, r = summary_ms(t["a"]), summary_ms(t["b"]), paired_ratio(t["a"], t["b"])
    return {"kind": "pair_grpc", "a": a, "b": b, "pairs": n, "case": case.name,
            "a_p50": sa["p50_ms"], "a_p95": sa["p95_ms"], "b_p50": sb["p50_ms"], "b_p95": sb["p95_ms"],
            "ratio_median": r["median_ratio"], "ci": [r["ci95_lo"], r["ci95_hi"]], "a_stages": {}, "b_stages": {}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.paired_stacks", description=__doc__.splitlines()[0])
    p.add_argument("a", help="HOST:PORT of stack A's HTTP")
    p.add_argument("b", help="HOST:PORT of stack B's HTTP")
    p.add_argument("-n", type=int, default=1000, help="request pairs")
    p.add_argument("--load", type=float, default=0.0, help="seconds of load per stack, client count and round (0: none)")
    p.add_argument("--clients", default="64", help="comma list of concurrent clients for --load")
    p.add_argument("--batch", type=int, default=0, metavar="STATES",
                   help="pair /v1/systemone/batch requests of this many copies of --case's state instead")
    p.add_argument("--case", default="short", help="the bench input whose state and questions each request sends "
                                                    "(short, q3, q6, t512, noul)")
    p.add_argument("--grpc", action="store_true", help="A and B are gRPC addresses: pair `Decide` calls of the "
                                                       "Python client (one DecideStream each) instead of HTTP")
    a = p.parse_args(argv)
    from laya_grpc.bench.inputs import named_cases
    case = next(c for c in named_cases() if c.name == a.case)
    if a.grpc:
        res = paired_grpc(a.a, a.b, a.n, case)
    elif a.batch:
        res = paired(a.a, a.b, a.n, warm=3, path="/v1/systemone/batch",
                     body={"model": "english", "states": [case.state] * a.batch, "questions": case.questions})
    else:
        res = paired(a.a, a.b, a.n, body={"model": "english", "state": case.state, "questions": case.questions})
    print("A p50 %.3f p95 %.3f | B p50 %.3f p95 %.3f | median A/B %.3f (95%% CI %.3f-%.3f), pairs %d" % (
        res["a_p50"], res["a_p95"], res["b_p50"], res["b_p95"], res["ratio_median"], *res["ci"], a.n))
    for k in res["a_stages"]:
        print("  %-18s A %.3f  B %.3f" % (k, res["a_stages"][k], res["b_stages"].get(k, float("nan"))))
    print(json.dumps(res), flush=True)
    if a.load:
        from laya_grpc.bench.service import load
        case = named_cases()[0]
        for clients in [int(c) for c in a.clients.split(",") if c]:
            for rnd in range(2):
                for name, addr in (("a", a.a), ("b", a.b)):
                    r = load("http", addr, [case], "english", clients, a.load, procs=min(8, clients))
                    print(json.dumps({"kind": "load", "clients": clients, "round": rnd, "stack": name,
                                      **{k: r[k] for k in ("req_per_s", "p50_ms", "p95_ms", "codes") if k in r}}),
                          flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
