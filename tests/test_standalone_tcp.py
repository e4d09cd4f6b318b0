"""Each service also runs on its own over TCP (multi-host setups), configured by flags or by
the environment variables that mirror them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

from stack import ROOT, free_port


def test_three_services_over_tcp(tiny_ckpt):
    tok, inf, http, grpc_port = free_port(), free_port(), free_port(), free_port()
    m_tok, m_inf, m_gw = free_port(), free_port(), free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAYA_")}
    me = [sys.executable, "-m", "laya_grpc.cli"]
    procs = [
        subprocess.Popen(me + ["tokenizer", "--listen", "127.0.0.1:%d" % tok, "--checkpoint", "english=" + tiny_ckpt,
                               "--metrics", "127.0.0.1:%d" % m_tok], cwd=ROOT, env=base, stderr=subprocess.PIPE),
        # configured through the environment only
        subprocess.Popen(me + ["inference"], cwd=ROOT, stderr=subprocess.PIPE,
                         env=dict(base, LAYA_LISTEN="127.0.0.1:%d" % inf,
                                  LAYA_CHECKPOINT="english=" + tiny_ckpt, LAYA_DEVICE="cpu",
                                  LAYA_METRICS="127.0.0.1:%d" % m_inf)),
        # the flags TEI and vLLM users reach for
        subprocess.Popen(me + ["gateway", "--host", "127.0.0.1", "--port", str(http), "--grpc-port", str(grpc_port),
                               "--tokenizer", "127.0.0.1:%d" % tok, "--inference", "127.0.0.1:%d" % inf,
                               "--checkpoint", "english=" + tiny_ckpt, "--metrics", "127.0.0.1:%d" % m_gw],
                         cwd=ROOT, env=base, stderr=subprocess.PIPE),
    ]
    try:
        deadline, health = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % http, timeout=2) as r:
                    health = json.loads(r.read())
                if health.get("ready"):
                    break
            except OSError:
                pass
            assert all(p.poll() is None for p in procs), [p.stderr.read().decode()[-2000:] for p in procs if p.poll() is not None]
            time.sleep(0.2)
        assert health.get("ready"), health
        assert any(k == "inference@127.0.0.1:%d" % inf for k in health["services"])
        req = urllib.request.Request("http://127.0.0.1:%d/v1/systemone" % http, method="POST", data=json.dumps(
            {"state": "hello, I need help with my invoice", "model": "english",
             "questions": {"q": {"type": "noul", "instructions": "billing?"}}}).encode())
        with urllib.request.urlopen(req, timeout=30) as r:
            body = json.loads(r.read())
        assert body["answers"]["q"]["type"] == "noul" and body["routing"]["model"] == "english"
        # each service exports only its own families (no `laya_gateway_ready 0` on the inference port)
        for port, own in ((m_tok, "laya_tokenizer_"), (m_inf, "laya_inference_"), (m_gw, "laya_gateway_")):
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as r:
                ours = {line.split("{")[0].split()[0] for line in r.read().decode().splitlines()
                        if line.startswith("laya_")}
            assert ours and all(name.startswith(own) for name in ours), (own, sorted(ours))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0, 0]


def test_http_listen_socket_gets_tcp_nodelay_connections():
    """The gateway's own HTTP socket must be IPPROTO_TCP, or asyncio leaves Nagle on for every
    accepted connection and each response waits ~40 ms for a delayed ACK."""
    import socket
    from laya_grpc.gateway.listen import listen_socket
    sock = listen_socket("127.0.0.1", 0, reuse_port=True)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
    finally:
        sock.close()


def test_gateway_and_tokenizer_processes_never_import_torch_or_mlx():
    """What `laya-grpc gateway` and `laya-grpc tokenizer` load (their whole command path) stays
    free of torch and mlx; only the inference service may load them."""
    code = ("import sys; from laya_grpc import cli; import argparse; "
            "import laya_grpc.gateway.server, laya_grpc.engine.remote_services, laya_grpc.gateway.grpc_api, laya_grpc.tokenizer.server, laya_grpc.cli.client_commands, laya_grpc.cli.serve; "
            "[m.add_arguments(argparse.ArgumentParser()) for m in (laya_grpc.gateway.server, laya_grpc.tokenizer.server, laya_grpc.cli.serve)]; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlx')); print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
