"""A DNS server on loopback for tests: answers A queries for the names it holds (TTL 0) from a
table the test changes while it runs, as a Kubernetes headless Service's records change when a
replica is added. Everything else gets an empty answer. gRPC's resolver reaches it through the
target's authority: `dns://127.0.0.1:PORT/NAME:PORT`."""
from __future__ import annotations

import socket
import struct
import threading
import time


class LoopbackDns:
    def __init__(self):
        self.records: dict[str, list[str]] = {}
        self.queries: list = []   # (monotonic time, name, type) of each query
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "LoopbackDns":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                data, peer = self._sock.recvfrom(512)
            except OSError:
                return
            try:
                self._sock.sendto(self._answer(data), peer)
            except (OSError, struct.error, IndexError, UnicodeDecodeError):
                pass

    def _answer(self, data: bytes) -> bytes:
        qid, _flags, qdcount = struct.unpack("!HHH", data[:6])
        at, labels = 12, []
        while data[at]:
            labels.append(data[at + 1: at + 1 + data[at]].decode("ascii"))
            at += 1 + data[at]
        qtype, _qclass = struct.unpack("!HH", data[at + 1: at + 5])
        question = data[12: at + 5]
        name = ".".join(labels).lower()
        self.queries.append((time.monotonic(), name, qtype))
        ips = self.records.get(name, []) if qtype == 1 else []
        rcode = 0 if name in self.records else 3   # NXDOMAIN for names it does not hold
        header = struct.pack("!HHHHHH", qid, 0x8180 | rcode, 1, len(ips), 0, 0)
        answers = b"".join(b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 0, 4) + socket.inet_aton(ip) for ip in ips)
        return header + question + answers
