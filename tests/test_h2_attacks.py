"""HTTP/2-level attacks on the gateway's gRPC port, sent as raw frames with the `h2` library over
loopback: rapid reset, PING and SETTINGS floods, and a compressed-message bomb. Each is bounded in
count and time; afterwards the gateway still answers a normal call, and the bomb gets a clean
status (never INTERNAL or UNKNOWN) without the gateway inflating it in memory."""
import gzip
import socket
import struct
import time

import grpc
import pytest

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from laya_grpc.client.requests import build_decide
from laya_grpc.core.runtime import memory  # noqa: E402
from laya_grpc.core.wire import rpc  # noqa: E402
from laya_proto.v1 import decision_pb2_grpc  # noqa: E402
from stack import Stack  # noqa: E402

PATH = "/laya_proto.v1.DecisionService/Decide"
STATE = "My parcel is late again."
QUESTIONS = {"n": {"type": "noul", "instructions": "Is the customer angry?"}}
BAD = (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)


@pytest.fixture(scope="module")
def stack(tiny_ckpt):
    with Stack({"english": tiny_ckpt}) as s:
        yield s


def _rss_mb(pid: int) -> float:
    return (memory.rss_bytes(pid) or 0) / 2**20


def _normal_call_ok(stack) -> None:
    with grpc.insecure_channel(stack.grpc, options=rpc.CHANNEL_OPTIONS) as ch:
        t = time.perf_counter()
        out = decision_pb2_grpc.DecisionServiceStub(ch).Decide(build_decide(STATE, QUESTIONS), timeout=30)
        assert len(out.answers) == 1
        assert time.perf_counter() - t < 10


class RawH2:
    """A client-side h2 connection over a plain socket (the gRPC port speaks h2c)."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.flush()
        self.closed = False

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def headers(self, stream_id: int, encoding: str | None = None) -> list:
        h = [(":method", "POST"), (":scheme", "http"), (":path", PATH), (":authority", "localhost"),
             ("content-type", "application/grpc"), ("te", "trailers")]
        if encoding:
            h.append(("grpc-encoding", encoding))
        return h

    def read_events(self, wait_s: float) -> list:
        """Events received within wait_s (until the peer closes)."""
        events, end = [], time.monotonic() + wait_s
        while time.monotonic() < end and not self.closed:
            self.sock.settimeout(max(0.01, end - time.monotonic()))
            try:
                data = self.sock.recv(1 << 16)
            except socket.timeout:
                break
            except OSError:
                self.closed = True
                break
            if not data:
                self.closed = True
                break
            try:
                events += self.conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.closed = True
                break
            self.flush()
        return events

    def close(self) -> None:
        self.sock.close()


def test_rapid_reset(stack):
    """Streams opened and reset at once (CVE-2023-44487), 2,000 of them on one connection."""
    c = RawH2(stack.grpc_port)
    c.read_events(0.5)
    t0 = time.monotonic()
    sid = 1
    for i in range(2000):
        if c.closed or time.monotonic() - t0 > 20:
            break
        try:
            c.conn.send_headers(sid, c.headers(sid))
            c.conn.reset_stream(sid, error_code=8)   # CANCEL
        except h2.exceptions.ProtocolError:
            break   # the server said GOAWAY or the stream limit was reached
        sid += 2
        if i % 50 == 0:
            c.flush()
            c.read_events(0.001)
    c.flush()
    c.read_events(0.5)
    print("rapid reset: %d streams opened and reset, connection %s" % ((sid - 1) // 2, "closed" if c.closed else "open"))
    c.close()
    _normal_call_ok(stack)


def _ping(c: RawH2, i: int) -> None:
    c.conn.ping(struct.pack(">Q", i))


def _settings(c: RawH2, i: int) -> None:
    c.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 65535 + i % 1000,
                            h2.settings.SettingCodes.HEADER_TABLE_SIZE: 4096 - i % 1000})


@pytest.mark.parametrize("frame, count", [(_ping, 20000), (_settings, 5000)], ids=["ping", "settings"])
def test_control_frame_flood(stack, frame, count):
    """20,000 PINGs, or 5,000 SETTINGS changing the window and table sizes, on one connection
    without reading what the server answers."""
    c = RawH2(stack.grpc_port)
    c.read_events(0.5)
    for i in range(count):
        if c.closed:
            break
        try:
            frame(c, i)
        except h2.exceptions.ProtocolError:
            break
        if i % 100 == 0:
            c.flush()
    c.flush()
    _normal_call_ok(stack)
    c.close()


def test_compressed_message_bomb(stack):
    """A gzip message that inflates to 256 MiB of zeros (about 250 KB on the wire), far over the
    public 16 MiB message cap: refused with RESOURCE_EXHAUSTED, and the gateway does not inflate it."""
    payload = gzip.compress(b"\0" * (256 << 20), compresslevel=9)
    gw = stack.child_pid("gateway")
    before = _rss_mb(gw)
    c = RawH2(stack.grpc_port)
    c.read_events(0.2)
    c.conn.send_headers(1, c.headers(1, encoding="gzip"))
    msg = b"\x01" + struct.pack(">I", len(payload)) + payload
    status, sent, t0 = None, 0, time.monotonic()
    while status is None and time.monotonic() - t0 < 30 and not c.closed:
        window = min(c.conn.local_flow_control_window(1), c.conn.max_outbound_frame_size)
        if sent < len(msg) and window > 0:
            chunk = msg[sent: sent + window]
            sent += len(chunk)
            c.conn.send_data(1, chunk, end_stream=sent >= len(msg))
            c.flush()
        for ev in c.read_events(0.05):
            if isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
                for k, v in ev.headers:
                    if k == "grpc-status":
                        status = int(v)
            elif isinstance(ev, h2.events.StreamReset):
                status = status if status is not None else -1
    c.close()
    print("bomb: status %s, sent %d of %d bytes, gateway RSS %.0f -> %.0f MB" % (status, sent, len(msg), before, _rss_mb(gw)))
    assert status is not None, "no answer to the compressed bomb"
    assert status not in (s.value[0] for s in BAD), "the bomb got %s" % status
    assert status in (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], grpc.StatusCode.INVALID_ARGUMENT.value[0]), status
    assert _rss_mb(gw) - before < 64, "the gateway inflated the bomb (RSS %.0f -> %.0f MB)" % (before, _rss_mb(gw))
    _normal_call_ok(stack)
