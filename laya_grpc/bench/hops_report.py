"""The report's per-hop section: each local transport side by side, where a request's time goes.

Rows per transport (the record's `transport`; older results may hold several): HTTP and gRPC short p50/p95, HTTP 512 tokens,
64-client throughput, then the parts of a short request: the tokenizer hop (server-side encode +
the rest = transport both ways and the handler), the inference hop (queue wait, model, the rest),
and the gateway's own path (HTTP p50 minus both hops: parse, admission, routing, decode, render).
`HTTP - in-process` is the served path's whole cost over the engine answering in-process.
"""
from __future__ import annotations

PARTS = ("tokenize_server", "tokenizer_transport", "queue_wait", "model", "inference_transport")


def _f(x) -> str:
    return "-" if x is None else "%.3f" % x


def transports(recs: list) -> list:
    out = []
    for r in recs:
        t = r.get("transport")
        if t and t not in out:
            out.append(t)
    return out


def primary(recs: list):
    """The transport the main tables show: the first one measured (None for older result files)."""
    ts = transports(recs)
    return ts[0] if ts else None


def _facts(recs: list, tr: str) -> dict:
    def get(target, kind, **match):
        for r in recs:
            if r["target"] == target and r["kind"] == kind and r.get("transport", tr) == tr \
                    and all(r.get(k) == v for k, v in match.items()):
                return r
        return None
    http = get("http", "latency", input="short")
    grpc = get("grpc", "latency", input="short")
    t512 = get("http", "latency", input="t512")
    engine = next((r for r in recs if r["target"] == "engine" and r["kind"] == "latency" and r["input"] == "short"), None)
    c64 = get("http", "concurrency", clients=64)
    hops = get("service", "hops", input="short")
    f = {"http_p50": http and http["e2e"]["p50_ms"], "http_p95": http and http["e2e"]["p95_ms"],
         "grpc_p50": grpc and grpc["e2e"]["p50_ms"], "grpc_p95": grpc and grpc["e2e"]["p95_ms"],
         "t512_p50": t512 and t512["e2e"]["p50_ms"], "engine_p50": engine and engine["e2e"]["p50_ms"],
         "c64_dps": c64 and c64["decisions_per_s"], "c64_p95": c64 and c64["p95_ms"], "hops": hops}
    f["http_minus_inproc"] = f["http_p50"] - f["engine_p50"] if f["http_p50"] is not None and f["engine_p50"] is not None else None
    f["gateway_own"] = (f["http_p50"] - hops["tokenizer_hop"]["p50_ms"] - hops["inference_hop"]["p50_ms"]
                        if hops and f["http_p50"] is not None else None)
    return f


def section(recs: list) -> list:
    ts = transports(recs)
    if not ts:
        return []
    L = ["", "## Local transports and the per-hop breakdown (short one-question request, ms)", "",
         "Hops measured from outside against `serve`'s children over the same transport; `rest` = the hop's "
         "round trip minus its server-side figures (transport both ways + handler); gateway own = HTTP p50 minus "
         "both hops (HTTP parse, auth and admission, routing, decoding, rendering, hand-offs).", "",
         "| transport | HTTP p50 / p95 | gRPC p50 / p95 | HTTP - in-process p50 | HTTP 512 tok p50 | 64 clients dec/s, p95 |",
         "|---|---|---|---|---|---|"]
    facts = {t: _facts(recs, t) for t in ts}
    for t, f in facts.items():
        L.append("| %s | %s / %s | %s / %s | %s | %s | %s, %s |" % (
            t, _f(f["http_p50"]), _f(f["http_p95"]), _f(f["grpc_p50"]), _f(f["grpc_p95"]), _f(f["http_minus_inproc"]),
            _f(f["t512_p50"]), "-" if f["c64_dps"] is None else "%.0f" % f["c64_dps"], _f(f["c64_p95"])))
    L += ["", "| transport | tokenizer hop | tokenize (server) | tokenizer rest | inference hop | queue wait | model "
              "| inference rest | gateway own |", "|---|---|---|---|---|---|---|---|---|"]
    for t, f in facts.items():
        h = f["hops"]
        if not h:
            continue
        cell = lambda k: "%s / %s" % (_f(h[k]["p50_ms"]), _f(h[k]["p95_ms"]))  # noqa: E731
        L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            t, cell("tokenizer_hop"), cell("tokenize_server"), cell("tokenizer_transport"), cell("inference_hop"),
            cell("queue_wait"), cell("model"), cell("inference_transport"), _f(f["gateway_own"])))
    stages = [("http_outside", "HTTP in/out (uvicorn parse, socket)"), ("admission_body", "auth, admission, body"),
              ("parse", "parse"), ("route", "routing"), ("tokenize_server", "tokenize (server)"),
              ("tokenizer_rest", "tokenizer transport + hand-offs"), ("queue_wait", "queue wait"), ("model", "model"),
              ("inference_rest", "inference transport + coalescing"), ("decode", "decoding"), ("render", "rendering"),
              ("client_total", "total (client)")]
    got = {t: next((r for r in recs if r["kind"] == "stages" and r.get("transport") == t and r.get("input") == "short"),
                   None) for t in ts}
    if any(got.values()):
        L += ["", "Inside one HTTP request (`x-laya-timing: 1`, sequential, short input), p50 / p95 ms:", "",
              "| stage | " + " | ".join(ts) + " |", "|---|" + "---|" * len(ts)]
        for key, label in stages:
            L.append("| %s | " % label + " | ".join(
                "%s / %s" % (_f(got[t][key]["p50_ms"]), _f(got[t][key]["p95_ms"])) if got[t] and key in got[t] else "-"
                for t in ts) + " |")
    return L


def summary(recs: list) -> str:
    """A few lines for the console (the CI log shows each change's cost on the path)."""
    out = []
    for t in transports(recs):
        f = _facts(recs, t)
        h = f["hops"]
        st = next((r for r in recs if r["kind"] == "stages" and r.get("transport") == t and r.get("input") == "short"), None)
        if st:
            out.append("stages p50 ms [%s]: " % t + ", ".join("%s %.3f" % (k, v["p50_ms"]) for k, v in st.items()
                                                              if isinstance(v, dict)))
        out.append("path cost [%s]: HTTP p50 %s ms, in-process p50 %s ms, HTTP - in-process %s ms; hops p50: "
                   "tokenizer %s (rest %s), inference %s (rest %s), gateway own %s" % (
                       t, _f(f["http_p50"]), _f(f["engine_p50"]), _f(f["http_minus_inproc"]),
                       _f(h and h["tokenizer_hop"]["p50_ms"]), _f(h and h["tokenizer_transport"]["p50_ms"]),
                       _f(h and h["inference_hop"]["p50_ms"]), _f(h and h["inference_transport"]["p50_ms"]),
                       _f(f["gateway_own"])))
    return "\n".join(out)
