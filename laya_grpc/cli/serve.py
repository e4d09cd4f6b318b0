"""`laya-grpc serve`: tokenizer, inference and gateway on this machine, over unix sockets.

The embedded default deployment. Each service runs in its own process (text work never
competes with the device thread for the GIL); the supervisor restarts a child that dies, and
the gateway's status stream reports it going down and coming back. With several inference
replicas (`--inference-replicas`, or `--device` listing several devices) the gateway balances over
them as over remote replicas (engine/balancing.py): a dead or restarting one gets no calls.

Every flag of the gateway, inference and tokenizer services is a flag of serve too, and reaches
every process it starts. 'laya-grpc config serve [FLAGS...]' prints the settings it would run with.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time

from laya_grpc.core.runtime import cpu_quota, flags, metrics
from laya_grpc.core.wire import ipc
from laya_grpc.core.errors import Kind, LayaError
from laya_grpc.core.runtime.lifecycle import install_stop_signals, setup_logging
from .settings import SERVE_ONLY, ServeSettings
from .supervisor import Child, FatalChildExit, Supervisor

log = logging.getLogger("laya_grpc.cli.serve")


def add_arguments(p: argparse.ArgumentParser) -> None:
    flags.add_settings(p, ServeSettings)


def python_argv() -> list:
    """How serve starts a child `laya-grpc` with a safe sys.path: the current directory is never on
    it, so a folder holding its own `gateway/`, `clients/` or `benchmarks/` package cannot shadow
    ours. `-P` on Python >= 3.11; on 3.10 the same by dropping sys.path[0] before the import."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "laya_grpc.cli"]
    return [sys.executable, "-c", "import sys; del sys.path[0]; from laya_grpc.cli.main import main; "
                                  "sys.exit(main())"]


def child_env(settings: ServeSettings, metrics_dir: str | None = None) -> dict:
    """Every child's environment: serve's settings whole, as variables (each child reads those of
    its own settings class), instead of the LAYA_ variables serve itself was given."""
    passed = [f for f in settings.__dataclass_fields__ if f not in SERVE_ONLY]
    extra = {metrics.MULTIPROC_ENV: metrics_dir} if metrics_dir else {}
    return flags.child_environment(flags.to_env(settings, passed), extra)


def child_argvs(args: argparse.Namespace, run_dir: str, env: dict | None = None) -> list:
    """The children and their command lines: what differs per child (its sockets, its device, the
    gateway's backend lists); everything else comes in `env` (child_env)."""
    env = child_env(args.settings) if env is None else env
    me = python_argv()
    cpus = cpu_quota.available_cpus()   # affinity and cgroup CPU quota, not the host's cores
    n_tok = args.tokenizer_workers or max(1, min(4, cpus // 4))   # ~0.6 ms of tokenizer CPU a request: 2 capped 64 clients
    n_gw = args.gateway_workers or max(1, min(4, cpus // 4))
    toks = ["unix:" + os.path.join(run_dir, "tokenizer-%d.sock" % i) for i in range(n_tok)]
    devices = inference_devices(args.device, args.inference_replicas)
    names = ["inference"] if len(devices) == 1 else ["inference-%d" % k for k in range(len(devices))]
    infs = ["unix:" + os.path.join(run_dir, n + ".sock") for n in names]
    # the inference replicas start first: theirs is the longest start (torch, the device, the checkpoint,
    # the warm-up), and the supervisor spawns the children one after another
    children = [Child(name, me + ["inference", "--listen", inf, "--device", device] + local_ipc(run_dir, name)[0],
                      env, stop_stage=1) for name, inf, device in zip(names, infs, devices)]
    children += [Child("tokenizer-%d" % i, me + ["tokenizer", "--listen", t]
                       + local_ipc(run_dir, "tokenizer-%d" % i)[0], env, stop_stage=1) for i, t in enumerate(toks)]
    inf_addrs = [local_ipc(run_dir, n)[1] for n in names]
    tok_addrs = [local_ipc(run_dir, "tokenizer-%d" % i)[1] for i in range(len(toks))]
    gw = me + ["gateway"]
    if n_gw > 1:
        gw.append("--reuse-port")
    for k in range(n_gw):
        # a gateway calls the first idle backend of its list (engine/remote_services.py, Replicas):
        # each worker gets the lists rotated by its index, so their first choices differ
        argv = gw + ["--inference", ",".join(_rotated(inf_addrs, k))]
        for t in _rotated(tok_addrs, k):
            argv += ["--tokenizer", t]
        # stopped first: a draining gateway still calls the tokenizers and inference replicas
        children.append(Child("gateway-%d" % k, argv + ["--control", control_address(run_dir, k)], env, stop_stage=0))
    return children


def _rotated(items: list, k: int) -> list:
    k %= len(items)
    return items[k:] + items[:k]


def local_ipc(run_dir: str, name: str) -> tuple:
    """(the child's extra flags, the gateway's address for it): its Tokenize or Infer calls go over
    IPC (core/wire/ipc.py); the child keeps its gRPC socket NAME.sock for health and status."""
    endpoint = "ipc://" + os.path.join(run_dir, name + ".ipc")
    return ["--ipc", endpoint], ipc.address(endpoint, "unix:" + os.path.join(run_dir, name + ".sock"))


def inference_devices(device: str, replicas: int) -> list:
    """The device of each inference replica: one per device when --device lists several,
    else `replicas` sharing the one."""
    listed = [d.strip() for d in str(device).split(",") if d.strip()] or ["auto"]
    if len(listed) == 1:
        return listed * replicas
    if replicas not in (1, len(listed)):
        raise LayaError(Kind.INVALID, "--inference-replicas %d does not match the %d devices of --device %s "
                        "(one replica per listed device)" % (replicas, len(listed), device))
    return listed


def control_address(run_dir: str, i: int) -> str:
    """Gateway worker i's own gRPC address (readiness, status), reachable even when the workers
    share --grpc and --http."""
    return "unix:" + os.path.join(run_dir, "gateway-%d.sock" % i)


def gateway_controls(children: list) -> list:
    out = []
    for c in children:
        if c.name.startswith("gateway-") and "--control" in c.argv:
            out.append(c.argv[c.argv.index("--control") + 1])
    return out


async def announce_ready(grpc_address: str, http: str, started: float, controls: list | None = None) -> None:
    """Print one line once every gateway worker reports SERVING (every service up, every checkpoint
    warm, and each worker's own warm-up done). Workers share --grpc, where a connection reaches only
    one of them, so each is watched through its own control address."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from laya_grpc.core.wire import rpc
    import grpc

    async def serving(address: str) -> None:
        while True:
            try:
                async with rpc.channel(address) as ch:
                    async for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="")):
                        if r.status == health_pb2.HealthCheckResponse.SERVING:
                            return
            except grpc.aio.AioRpcError:
                await asyncio.sleep(0.3)

    addresses = list(controls or [grpc_address])
    await asyncio.gather(*[serving(a) for a in addresses])
    workers = " (%d gateway workers)" % len(addresses) if len(addresses) > 1 else ""
    print("laya-grpc: ready in %.1f s: http://%s/v1/systemone, grpc %s%s"
          % (time.monotonic() - started, http, grpc_address, workers), file=sys.stderr, flush=True)


def serve_metrics(args: argparse.Namespace, run_dir: str) -> str | None:
    """With --metrics each child writes its samples under the run dir (prometheus-client's
    multiprocess mode, set in the children's environment) for serve's one endpoint to export;
    the directory, or None."""
    if not args.metrics:
        return None
    directory = os.path.join(run_dir, "metrics")
    shutil.rmtree(directory, ignore_errors=True)   # samples of an earlier run would add up with ours
    os.makedirs(directory)
    try:
        where = metrics.serve_aggregated(args.metrics, directory)
    except OSError as e:
        raise LayaError(Kind.INVALID, "cannot serve --metrics on %s: %s" % (args.metrics, e)) from None
    log.info("metrics of every process on http://%s/metrics", where)
    return directory


async def serve(args: argparse.Namespace) -> int:
    started = time.monotonic()
    own_dir = args.run_dir is None
    run_dir = tempfile.mkdtemp(prefix="laya-grpc-") if own_dir else args.run_dir
    os.makedirs(run_dir, exist_ok=True)
    try:
        metrics_dir = serve_metrics(args, run_dir)
        children = child_argvs(args, run_dir, child_env(args.settings, metrics_dir))
        stop = asyncio.Event()
        install_stop_signals(stop)
        async with Supervisor(children, on_exit=lambda pid: metrics.process_gone(pid, metrics_dir)) as sup:
            try:
                ready = asyncio.ensure_future(announce_ready(args.grpc, args.http, started, gateway_controls(children)))
                stopper = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait([stopper, sup.fatal], return_when=asyncio.FIRST_COMPLETED)
                ready.cancel()
                stopper.cancel()
                if sup.fatal in done:
                    err = sup.fatal.exception()
                    print("laya-grpc serve: %s; stopping (see the message above)" % err, file=sys.stderr)
                    return err.code if isinstance(err, FatalChildExit) else 1
            finally:   # the gateways drain first (up to --drain-grace-seconds each), then the services they call
                await sup.close(grace_s=args.drain_grace_s + 5.0)
        return 0
    finally:
        if own_dir:
            shutil.rmtree(run_dir, ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    setup_logging("serve", args.log_level, args.log_format, args.access_log)
    try:
        args.settings.checkpoint_sources()
        inference_devices(args.device, args.inference_replicas)
    except LayaError as e:
        print("laya-grpc serve: %s" % e.detail, file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(args))
    except LayaError as e:
        print("laya-grpc serve: %s" % e.detail, file=sys.stderr)
        return 2
