"""The host's cost of one answer after the network: decode, finish, then render (HTTP) or pack (gRPC).

`Decider.decide` runs on services that answer at once with fixed logits (no tokenizer, no network),
for a request of three questions (a 4-option choice, a 5-level score, a noul) on an explicit model
(no language detection), so what is timed is the answer loop's own work: decoding the rows, the
gate and serve fields, and the `/v1/systemone` JSON bytes or the typed `DecideResponse`. Prints one
JSON line of per-request times in microseconds: the mean of the fastest of many short bursts, which
other processes on a shared host disturb least.

Runs against the `laya_grpc` on the path, so two builds compare by running it from each tree, in
turns (the figures are small and a shared host is noisy):

    for i in 1 2 3 4 5; do for t in TREE_A TREE_B; do
      PYTHONPATH=$t:$t/protos/gen python benchmarks/answer_path.py; done; done
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np

QUESTIONS = {"category": {"type": "choice", "instructions": "What is the customer asking about?",
                          "criteria": ["refund", "delivery", "account", "other"]},
             "urgency": {"type": "score", "instructions": "How urgent is it?",
                         "criteria": ["none", "low", "some", "high", "critical"]},
             "needs_human": {"type": "noul", "instructions": "Does this need a human?"}}
BODY = json.dumps({"state": "The parcel came late and the box was damaged.", "questions": QUESTIONS,
                   "model": "english", "min_confidence": 0.4}).encode()


def _services(n_questions: int):
    """Services answering at once: each state's usage block and fixed option and act logits."""
    from laya_grpc.core.decisions.temperatures import Temperatures
    from laya_grpc.engine import services as api
    try:
        from laya_grpc.core.decisions.answers import Usage
        usage = Usage(input_tokens=90, output_tokens=0, state_tokens=12)
    except ImportError:   # a tree whose answer loop passes usage dicts
        usage = {"input_tokens": 90, "output_tokens": 0, "state_tokens": 12, "state_tokens_dropped": 0,
                 "truncated": False, "truncated_questions": []}
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=k).astype(np.float32) * 2 for k in (4, 5, 2)][:n_questions]
    act = [np.asarray([1.5, -0.5], np.float32)] * n_questions
    config = {"temperature": [1.25, 0.9, 1.1], "temperature_by_options": {"choice:3-5": 0.8}}
    temperatures = Temperatures.from_config(config)

    class Fixed:
        async def tokenize(self, checkpoint, states, questions, max_len, head_max_len):
            return [api.Encoded(rows=None, usage=usage) for _ in states]

        async def infer(self, checkpoint, rows):
            return api.InferResult(logits=logits * len(rows), act_logits=act * len(rows))

        async def temperatures(self, name):
            return temperatures

        async def checkpoint(self, name):   # a tree whose answer loop reads the config itself
            return api.CheckpointInfo(name=name, config=config)
    return Fixed()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bursts", type=int, default=100)
    p.add_argument("--per", type=int, default=50, help="requests per burst")
    a = p.parse_args(argv)
    import laya_grpc
    from laya_grpc.core.decisions.routing import RouteTable
    from laya_grpc.engine.decider import Decider
    from laya_grpc.gateway import typed_answer
    from laya_grpc.gateway.http_body import parse_decide_body
    from laya_grpc.gateway.render import render_json
    from laya_grpc.gateway.settings import GatewaySettings
    from laya_proto.v1 import decision_pb2

    decider = Decider(_services(len(QUESTIONS)), RouteTable.build(), GatewaySettings())
    req = parse_decide_body(BODY, decider.route_table)
    pack = getattr(typed_answer, "pack_decision", None) or getattr(typed_answer, "pack_result")

    def http(result) -> bytes:
        return render_json(result.body() if hasattr(result, "body") else result)

    def grpc(result) -> bytes:
        resp = decision_pb2.DecideResponse()
        pack(result, resp)
        return resp.SerializeToString()

    async def timed(finish) -> float:
        best = float("inf")
        for _ in range(a.bursts):
            t0 = time.perf_counter()
            for _ in range(a.per):
                finish(await decider.decide(req))
            best = min(best, (time.perf_counter() - t0) / a.per)
        return best * 1e6

    loop = asyncio.new_event_loop()
    loop.run_until_complete(timed(http))   # warm
    out = {"tree": laya_grpc.__file__, "decide_us": loop.run_until_complete(timed(lambda r: r)),
           "http_us": loop.run_until_complete(timed(http)), "grpc_us": loop.run_until_complete(timed(grpc))}
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
