"""results.jsonl -> report.md (+ PNG plots when matplotlib is installed; the report says when not)."""
from __future__ import annotations

import json
import os

from . import hops_report

TARGETS = ("upstream", "upstream-compiled", "engine", "grpc", "http")
LABEL = {"upstream": "upstream laya eager", "upstream-compiled": "upstream laya compile=True",
         "engine": "our engine (in-process)", "grpc": "our gRPC Decide", "http": "our HTTP gateway"}
INPUTS = ("short", "q3", "q6", "t512", "noul")


def _f(x, fmt="%.2f") -> str:
    return "-" if x is None else fmt % x


def load(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def hop_summary(jsonl: str) -> str:
    return hops_report.summary(load(jsonl))


def write_report(jsonl: str, out_dir: str) -> str:
    all_recs = load(jsonl)
    main = hops_report.primary(all_recs)   # the main tables show the first transport; all are side by side below
    recs = [r for r in all_recs if r.get("transport", main) == main]
    by = lambda t, k: [r for r in recs if r["target"] == t and r["kind"] == k]  # noqa: E731
    env = (by("suite", "environment") or [{}])[0]
    L = ["# laya-grpc benchmark", "",
         "commit `%s`%s, %s; GPU: %s; device %s, backend %s; torch %s, laya %s, python %s; checkpoint preset `%s`%s."
         % (env.get("commit", "?")[:12] if env.get("commit") != "unknown" else "unknown: %s" % env.get("tree"),
            " (dirty tree)" if env.get("dirty") else "", env.get("date"),
            env.get("gpu") or "none", env.get("device"), env.get("backend"), env.get("torch"), env.get("laya"),
            env.get("python"), env.get("preset"), " (SMOKE: figures are not meaningful)" if env.get("smoke") else ""),
         ""]
    lat = {(r["target"], r["input"]): r for r in recs if r["kind"] == "latency"}
    tok = {r["input"]: r.get("tokens") for r in by("engine", "latency")}
    rows_n = {r["input"]: r.get("rows") for r in by("engine", "latency")}
    L += ["## Warm latency, ms (p50 / p95)", "",
          "| target | " + " | ".join("%s (%s rows, %s tok)" % (i, rows_n.get(i, "?"), tok.get(i, "?")) for i in INPUTS) + " |",
          "|---|" + "---|" * len(INPUTS)]
    for t in TARGETS:
        if any((t, i) in lat for i in INPUTS):
            L.append("| %s | " % LABEL[t] + " | ".join(
                "%s / %s" % (_f(lat[(t, i)]["e2e"]["p50_ms"]), _f(lat[(t, i)]["e2e"]["p95_ms"])) if (t, i) in lat
                else "-" for i in INPUTS) + " |")
    if by("engine", "latency"):
        L += ["", "Where the time goes (engine, p50 ms): model = the runner on the request's padded batch, numpy out (the GPU part; a packing runner turns it back into rows first); "
              "tokenize = encode + pack + pad; engine e2e includes decoding; gRPC and HTTP add transport and "
              "the tokenizer and gateway services on top of it.", "",
              "| input | model | tokenize | engine e2e | gRPC | HTTP |", "|---|---|---|---|---|---|"]
        for r in by("engine", "latency"):
            i = r["input"]
            L.append("| %s | %s | %s | %s | %s | %s |" % (
                i, _f(r["model"]["p50_ms"], "%.3f"), _f(r["tokenize"]["p50_ms"], "%.3f"), _f(r["e2e"]["p50_ms"], "%.3f"),
                _f(lat.get(("grpc", i), {}).get("e2e", {}).get("p50_ms")),
                _f(lat.get(("http", i), {}).get("e2e", {}).get("p50_ms"))))
    L += ["", "## Start-up", "", "| target | checkpoint load s | warmup s | process to ready s | first request ms |",
          "|---|---|---|---|---|"]
    for t in TARGETS:
        st, fr = by(t, "startup"), by(t, "first_request")
        if t == "grpc":
            continue
        if t == "http":
            st = by("service", "startup")
        if st or fr:
            s = st[0] if st else {}
            L.append("| %s | %s | %s | %s | %s |" % (LABEL[t], _f(s.get("load_s")), _f(s.get("warmup_s")),
                                                    _f(s.get("process_to_ready_s")), _f(fr[0]["ms"] if fr else None)))
    conc = [r for r in recs if r["kind"] == "concurrency"]
    if conc:
        L += ["", "## Concurrency (short one-question requests, closed loop)", "",
              "Forwards, rows a forward and device busy (the share of the run a forward was running) come "
              "from the inference service's metrics.", "",
              "| target | clients | req/s | decisions/s | p50 ms | p95 ms | forwards | rows a forward | device busy "
              "| status counts |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in conc:
            L.append("| %s | %d | %.0f | %.0f | %s | %s | %s | %s | %s | %s |" % (
                LABEL[r["target"]], r["clients"], r["req_per_s"], r["decisions_per_s"], _f(r["p50_ms"]),
                _f(r["p95_ms"]), r.get("forwards", "-"), _f(r.get("rows_per_forward")),
                _f(r.get("device_busy")), json.dumps(r["codes"])))
    L += replicas_section(all_recs)
    batches = [dict(r, states=r.get("states", 64)) for r in recs if r["kind"] in ("batch", "batch64")]
    if batches:
        L += ["", "## predict_batch of short states (in-process)", "", "| target | states | decisions/s | p50 ms |",
              "|---|---|---|---|"]
        L += ["| %s | %d | %.0f | %s |" % (LABEL[r["target"]], r["states"], r["decisions_per_s"], _f(r["p50_ms"]))
              for r in batches]
    mem = [r for r in recs if r["kind"] == "memory"]
    if mem:
        L += ["", "## Memory", "", "| target | phase | figures |", "|---|---|---|"]
        for r in mem:
            fig = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in r.items() if k not in ("target", "kind", "phase")}
            L.append("| %s | %s | `%s` |" % (r["target"], r["phase"], json.dumps(fig)))
    gc = by("engine", "graph_cache")
    if gc:
        L += ["", "CUDA graph cache after the soak: `%s`" % json.dumps({k: v for k, v in gc[0].items() if k not in ("target", "kind")})]
    par, dec = by("engine", "parity"), by("engine", "parity_declared")
    if par:
        p, d = par[0], dec[0]
        L += ["", "## Output parity against %s (tolerance declared before measuring: |dp| <= %g, near tie = top-2 margin < %g)"
              % (d["reference"], d["tol_dp"], d["tie_margin"]), "",
              "rows %d, decisions equal %d, near ties %d, disagreements outside ties %d, max |dp| %.2e: **%s**"
              % (p["rows"], p["agree"], p["near_ties"], p["disagree_outside_ties"], p["max_abs_dp"],
                 "PASS" if p["passed"] else "FAIL")]
    ab = [r for r in recs if r["kind"] == "ab"]
    if ab:
        L += ["", "## Paired A/B (same process, alternating order)", "",
              "| input | A | B | median A/B time ratio | 95% bootstrap CI | pairs |", "|---|---|---|---|---|---|"]
        L += ["| %s | %s | %s | %.2f | %.2f-%.2f | %d |" % (r["input"], r["a"], r["b"], r["median_ratio"], r["ci95_lo"],
                                                         r["ci95_hi"], r["pairs"]) for r in ab]
    idle = by("engine", "idle_gap")
    if idle:
        L += ["", "## First request after a quiet gap (engine, short)", "", "| gap s | keep-warm every s | ms |", "|---|---|---|"]
        L += ["| %g | %s | %.3f |" % (r["gap_s"], r["keep_warm_s"] or "off", r["ms"]) for r in idle]
        for r in by("engine", "keep_warm_cost"):
            L.append("\nkeep-warm cost: %d extra forwards in %.1f s of quiet (one short forward every %g s)."
                     % (r["forwards"], r["seconds"], r["keep_warm_s"]))
    L += hops_report.section(all_recs)
    errs = [r for r in all_recs if r["kind"] == "error" or (r["kind"] == "process" and r["returncode"])]
    if errs:
        L += ["", "## Failures", ""] + ["- `%s`" % json.dumps(r) for r in errs]
    L += ["", "## Plots", ""] + _plots(recs, out_dir)
    md = os.path.join(out_dir, "report.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write("\n".join(L) + "\n")
    return md


def replicas_section(recs: list) -> list:
    """`serve --inference-replicas N` on one device: decisions/s and p95 per client count, each N
    side by side, the ratio of the largest N's throughput to the smallest's, and which is faster."""
    rs = [r for r in recs if r["kind"] == "replicas"]
    if not rs:
        return []
    ns = sorted({r["replicas"] for r in rs})
    cell = {(r["replicas"], r["clients"]): r for r in rs}
    lo, hi = ns[0], ns[-1]
    name = lambda n: "%d replica%s" % (n, "" if n == 1 else "s")  # noqa: E731
    L = ["", "## Inference replicas on one device (short one-question HTTP requests, closed loop)", "",
         "| clients | " + " | ".join("%s dec/s, p95 ms" % name(n) for n in ns) + " | ratio %d/%d |" % (hi, lo),
         "|---|" + "---|" * (len(ns) + 1)]
    verdicts = []
    for c in sorted({r["clients"] for r in rs}):
        row = [cell.get((n, c)) for n in ns]
        ratio = (cell[(hi, c)]["decisions_per_s"] / cell[(lo, c)]["decisions_per_s"]
                 if (hi, c) in cell and (lo, c) in cell and cell[(lo, c)]["decisions_per_s"] else None)
        L.append("| %d | " % c + " | ".join("%.0f, %s%s" % (x["decisions_per_s"], _f(x["p95_ms"]),
                                                           " (%d errors)" % x["errors"] if x["errors"] else "")
                                            if x else "-" for x in row) + " | %s |" % _f(ratio))
        if ratio is not None:
            win = hi if ratio >= 1 else lo
            verdicts.append("at %d clients %s %s faster (x%.2f decisions/s)"
                            % (c, name(win), "is" if win == 1 else "are", max(ratio, 1 / ratio)))
    if verdicts and hi != lo:
        L += ["", "Throughput: " + "; ".join(verdicts) + "."]
    return L


def _plots(recs: list, out_dir: str) -> list:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["(no plots: matplotlib is not installed where this ran)"]
    lines = []
    lat = [r for r in recs if r["kind"] == "latency"]
    if lat:
        fig, ax = plt.subplots(figsize=(9, 4))
        ts = [t for t in TARGETS if any(r["target"] == t for r in lat)]
        w = 0.8 / max(1, len(ts))
        for j, t in enumerate(ts):
            vals = [next((r["e2e"]["p50_ms"] for r in lat if r["target"] == t and r["input"] == i), 0) for i in INPUTS]
            ax.bar([k + j * w for k in range(len(INPUTS))], vals, w, label=LABEL[t])
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(INPUTS))], INPUTS)
        ax.set_yscale("log")
        ax.set_ylabel("p50 ms (log)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "latency.png"), dpi=110)
        plt.close(fig)
        lines.append("![warm p50 latency](latency.png)")
    conc = [r for r in recs if r["kind"] == "concurrency"]
    if conc:
        fig, ax = plt.subplots(figsize=(6, 4))
        for t in ("grpc", "http"):
            rs = [r for r in conc if r["target"] == t]
            if rs:
                ax.plot([r["clients"] for r in rs], [r["decisions_per_s"] for r in rs], "o-", label=LABEL[t])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("decisions/s")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "throughput.png"), dpi=110)
        plt.close(fig)
        lines.append("![throughput vs clients](throughput.png)")
    return lines


if __name__ == "__main__":   # regenerate report.md and plots from a results.jsonl: python -m laya_grpc.bench.report DIR
    import sys
    print(write_report(os.path.join(sys.argv[1], "results.jsonl"), sys.argv[1]))
