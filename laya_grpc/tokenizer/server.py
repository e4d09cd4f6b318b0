"""`laya-grpc tokenizer`: requests (states + questions) in, Laya's packed token rows out.

Its own process so text work never competes with the device thread for the GIL; run several
processes to scale (`serve --tokenizer-workers N`). Never imports torch or mlx.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Optional

from laya_grpc.core.runtime import draining, flags, logs, memory, metrics, request_id, tracing
from laya_grpc.core.wire import ipc, rpc
from laya_grpc.core.wire.calls import serve_calls
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.lifecycle import install_stop_signals, setup_observability
from laya_grpc.core.wire.packed_rows import PackedRows
from laya_grpc.core.wire.question_wire import StateText, question_from_text
from laya_grpc.core.checkpoints.sources import open_source
from laya_proto.internal.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from laya_proto.v1 import tokens_pb2

from .encoding import EncodeJob, TextEncoder
from .microbatch import MicroBatcher
from .settings import TokenizerSettings

log = logging.getLogger("laya_grpc.tokenizer")
SERVICE_NAME = tokenizer_pb2.DESCRIPTOR.services_by_name["TokenizerService"].full_name
# characters of state and question JSON after which an idle tokenizer gives freed heap back (core/runtime/memory.py):
# encoding takes many times its input's size at its peak (ten 2 MiB batches left 46 MB behind)
TRIM_AFTER_CHARS = 256 * 1024


@dataclass
class ServedTokenizer:
    name: str
    encoder: TextEncoder
    max_len: int
    head_max_len: int
    parallel: bool
    batcher: Optional[MicroBatcher] = None


def load_tokenizers(sources: dict) -> dict:
    out = {}
    for name, source in sources.items():
        ckpt = open_source(source)
        parallel = ckpt.parallel
        enc = TextEncoder(ckpt.tokenizer_dir, max_len=int(ckpt.max_len), head_max_len=int(ckpt.head_max_len),
                          parallel_layout=parallel)
        out[name] = ServedTokenizer(name, enc, int(ckpt.max_len), int(ckpt.head_max_len), parallel)
        log.info("tokenizer %s ready (%s, fingerprint %s)", name, ckpt.tokenizer_dir, enc.fingerprint[:12])
    return out


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServiceServicer):
    def __init__(self, tokenizers: dict, pool: ThreadPoolExecutor):
        self.tokenizers, self.pool = tokenizers, pool
        self.serving = False    # what grpc.health.v1 says (calls are counted by it)
        self.address = ""       # where it listens (the replica label of its error counter)
        self.inflight = 0       # calls running (draining waits for them; the heap is trimmed once none is)
        self.trim = memory.IdleTrim(lambda: self.inflight, lambda fn: asyncio.get_running_loop().run_in_executor(pool, fn),
                                    TRIM_AFTER_CHARS, metrics.TOKENIZER_HEAP_TRIMS)
        self._calls = {True: metrics.TOKENIZER_CALLS.labels("yes"), False: metrics.TOKENIZER_CALLS.labels("no")}

    def _get(self, name: str) -> ServedTokenizer:
        tok = self.tokenizers.get(name)
        if tok is None:
            if not self.tokenizers:   # still loading: a client that ignores health (or a restart raced it) may retry
                raise LayaError(Kind.BUSY, "tokenizer service is starting: its tokenizers are still loading")
            raise LayaError(Kind.NOT_FOUND, "unknown checkpoint %r; this tokenizer serves %s" % (name, sorted(self.tokenizers)))
        return tok

    @rpc.servicer_errors
    async def Tokenize(self, request, context):
        return await self.tokenize(request)

    async def TokenizeStream(self, request_iterator, context):
        await serve_calls(request_iterator, context, self.tokenize, tokenizer_pb2.TokenizeReply,
                          tokens_pb2.CallError, "Tokenize")

    async def tokenize(self, request) -> tokenizer_pb2.TokenizeResponse:
        # this call's own task: its log lines carry the request id and trace id
        request_id.begin(request.origin.request_id, request.origin.traceparent)
        self._calls[self.serving].inc()
        self.inflight += 1
        t0 = time.perf_counter()
        try:
            with logs.call_failures(log, "Tokenize", metrics.TOKENIZER_ERRORS, self.address), \
                    tracing.server_span(tracing.TOKENIZE, request.origin.traceparent, checkpoint=request.checkpoint):
                resp = await self._tokenize(request)
            seconds = time.perf_counter() - t0
            metrics.TOKENIZE_SECONDS.observe(seconds)
            if log.isEnabledFor(logging.DEBUG):   # LAYA_LOG_LEVEL=DEBUG: one line per call
                log.debug("Tokenize %s: %d states, %d rows, %.2f ms", request.checkpoint, len(request.states),
                          resp.rows_per_state * len(request.states), seconds * 1e3)
            return resp
        finally:
            self.inflight -= 1
            self.trim.ended()

    async def _tokenize(self, request) -> tokenizer_pb2.TokenizeResponse:
        tok = self._get(request.checkpoint)
        states = [StateText(s.text, s.keep_end) for s in request.states]   # already rendered by the caller
        self.trim.add(sum(len(s.text) for s in states))
        questions = [question_from_text(q) for q in request.questions]
        max_len = request.max_len if request.HasField("max_len") else None
        head_max_len = request.head_max_len if request.HasField("head_max_len") else None
        t0 = time.perf_counter()
        if tok.batcher is None:
            tok.batcher = MicroBatcher(tok.encoder, self.pool)
        encoded = await tok.batcher.encode(EncodeJob(states, questions, max_len, head_max_len))
        rows = PackedRows.from_rows([r for e in encoded for r in e.rows], tok.encoder.fingerprint)
        resp = tokenizer_pb2.TokenizeResponse(rows_per_state=len(questions), tokenize_ms=(time.perf_counter() - t0) * 1e3)
        for e in encoded:
            e.usage.to_proto(resp.usage.add())
        rows.to_proto(resp.rows)
        return resp

    @rpc.servicer_errors
    async def GetTokenizerInfo(self, request, context):
        names = [request.checkpoint] if request.checkpoint else list(self.tokenizers)
        info = tokenizer_pb2.TokenizerInfo()
        for n in names:
            t = self._get(n)
            info.entries.add(checkpoint=n, fingerprint=t.encoder.fingerprint, max_len=t.max_len,
                             head_max_len=t.head_max_len, parallel_layout=t.parallel, pad_id=t.encoder.pad_id)
        return info


async def serve(sources: dict, address: str, threads: int, metrics_address: Optional[str] = None,
                ipc_endpoint: Optional[str] = None, drain_grace_s: float = draining.DEFAULT_GRACE_S) -> int:
    metrics.serve_metrics(metrics_address)
    srv = rpc.server()
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tok")
    servicer = TokenizerServicer({}, pool)
    tokenizer_pb2_grpc.add_TokenizerServiceServicer_to_server(servicer, srv)
    hs = rpc.add_health_and_reflection(srv, [SERVICE_NAME])
    await rpc.set_health(hs, [SERVICE_NAME], False)
    try:
        address = servicer.address = rpc.bind(srv, address)
    except RuntimeError as e:
        print("laya-grpc tokenizer: cannot listen on %s: %s (address in use?)" % (address, e), file=sys.stderr)
        return 2
    await srv.start()
    calls = ipc_endpoint and ipc.IpcServer(ipc_endpoint, servicer.tokenize, tokenizer_pb2.TokenizeCall,
                                           tokenizer_pb2.TokenizeReply, tokens_pb2.CallError, "Tokenize").start()
    log.info("tokenizer listening on %s%s", address, " and " + ipc_endpoint if ipc_endpoint else "")
    try:
        servicer.tokenizers = await asyncio.get_running_loop().run_in_executor(None, load_tokenizers, sources)
        memory.freeze_warm_heap()
    except LayaError as e:
        log.error("cannot load tokenizers: %s", e.detail)
        print("laya-grpc tokenizer: %s" % e.detail, file=sys.stderr)
        await srv.stop(0)
        return 2
    await rpc.set_health(hs, [SERVICE_NAME], True)
    servicer.serving = True
    stop = asyncio.Event()
    install_stop_signals(stop)
    await stop.wait()
    servicer.serving = False
    await draining.drain(srv, hs, [SERVICE_NAME], drain_grace_s, lambda: servicer.inflight, "tokenizer")
    servicer.trim.close()
    if calls:   # IPC calls in flight were counted in inflight, so none is cut off here
        await calls.close()
    pool.shutdown(wait=False)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, TokenizerSettings)


def run(args: argparse.Namespace) -> int:
    settings = args.settings
    setup_observability("tokenizer", settings)
    try:
        sources = settings.checkpoint_sources()
    except LayaError as e:
        print("laya-grpc tokenizer: %s" % e.detail, file=sys.stderr)
        return 2
    return asyncio.run(serve(sources, settings.listen, settings.tokenizer_threads, settings.metrics, settings.ipc,
                             settings.drain_grace_s))
