"""docs/metrics.md lists every metric family: exactly those laya_grpc/core/runtime/metrics.py defines, with
their types, and every family a live `serve --metrics` endpoint exports is among them."""
from __future__ import annotations

import os
import re
import urllib.request

from laya_grpc.core.runtime import metrics
from stack import ROOT, Stack, free_port

BODY = {"state": "Where is my parcel?", "model": "english", "questions": {"q": {"type": "noul", "instructions": "?"}}}


def documented() -> dict:
    """{family name: type} from the table in docs/metrics.md (a row may name several families)."""
    out = {}
    with open(os.path.join(ROOT, "docs", "metrics.md"), encoding="utf-8") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0].startswith("`laya_"):
                for name in re.findall(r"`(laya_[a-z0-9_]+)`", cells[0]):
                    out[name] = cells[1].split()[0]
    return out


def test_the_doc_lists_exactly_the_defined_families():
    defined = {f.name: f.cls.__name__.lower() for f in metrics.FAMILIES}
    assert documented() == defined


def test_every_family_of_a_live_endpoint_is_documented(tiny_ckpt):
    port = free_port()
    with Stack({"english": tiny_ckpt}, extra_args=["--metrics", "127.0.0.1:%d" % port]) as s:
        assert s.post("/v1/systemone", BODY)[0] == 200
        assert s.post("/v1/systemone", {"state": "x", "questions": {"q": {"type": "nope"}}})[0] == 422
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            text = r.read().decode()
    live = dict(re.findall(r"^# TYPE (laya_[a-z0-9_]+) (\w+)$", text, re.M))
    # prometheus-client names a counter's family without its `_total`
    live = {(n + "_total" if t == "counter" and not n.endswith("_total") else n): t for n, t in live.items()}
    doc = documented()
    assert {n for n in live if n not in doc} == set(), "exported but not in docs/metrics.md"
    assert {n: t for n, t in live.items() if doc[n] != t} == {}
    for service in ("gateway", "tokenizer", "inference"):
        assert any(n.startswith("laya_%s_" % service) for n in live), (service, sorted(live))
