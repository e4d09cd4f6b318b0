"""Where a backend lives: one endpoint, a list of replicas, or a DNS name that resolves to replicas.

`--tokenizer` and `--inference` take `HOST:PORT`, `unix:/path` (or `/path.sock`), comma lists of
those (the flag may also be repeated), and `dns:///NAME:PORT`. Each endpoint is a replica with its
own channel and call stream (remote_services.py `Replicas` picks one per call); a `dns:///` name becomes
one gRPC channel that gRPC itself balances over the replicas (balancing.py). A host name inside a
list is resolved once, at start-up; a name whose addresses change (a Kubernetes headless Service)
belongs in `dns:///`, which gRPC re-resolves.
`ipc://` endpoints belong to the local IPC transport, not to gRPC: they come back untouched with
`scheme == "ipc"` for it to handle.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Sequence

from laya_grpc.core.errors import Kind, LayaError


@dataclass(frozen=True)
class BackendTarget:
    spec: str                      # the endpoints as given, comma-joined (logs, /health keys)
    endpoints: tuple[str, ...]     # each replica's own target (dialled and watched one by one); () for dns:///
    scheme: str = "grpc"           # "grpc" | "ipc" | "dns" (spec is the name gRPC resolves)


def split_entries(values: Sequence[str] | str) -> list[str]:
    values = [values] if isinstance(values, str) else list(values)
    return [e.strip() for v in values for e in str(v).split(",") if e.strip()]


def parse_target(values: Sequence[str] | str, flag: str) -> BackendTarget:
    entries = split_entries(values)
    if not entries:
        raise LayaError(Kind.INVALID, "%s: no address given" % flag)
    spec = ",".join(entries)
    ipc = [e for e in entries if e.startswith("ipc://")]
    if ipc:
        if len(ipc) != len(entries):
            raise LayaError(Kind.INVALID, "%s %s: ipc:// endpoints cannot be mixed with gRPC ones" % (flag, spec))
        return BackendTarget(spec, tuple(entries), scheme="ipc")
    if any(e.startswith("dns:") for e in entries):
        if len(entries) != 1:
            raise LayaError(Kind.INVALID, "%s %s: a dns:/// target stands alone (it resolves to every "
                            "replica itself)" % (flag, spec))
        return BackendTarget(spec, (), scheme="dns")
    unix = [_unix_path(e) for e in entries if _is_unix(e)]
    if len(entries) == 1:
        return BackendTarget(spec, ("unix:" + unix[0] if unix else entries[0],))
    if unix:
        if len(unix) != len(entries):
            raise LayaError(Kind.INVALID, "%s %s: unix sockets and TCP endpoints cannot be mixed" % (flag, spec))
        return BackendTarget(spec, tuple("unix:" + p for p in unix))
    addrs = [a for e in entries for a in _resolve(e, flag)]
    addrs = list(dict.fromkeys(addrs))
    return BackendTarget(spec, tuple("[%s]:%d" % a if ":" in a[0] else "%s:%d" % a for a in addrs))


def _is_unix(entry: str) -> bool:
    return entry.startswith("unix:") or entry.startswith("/")


def _unix_path(entry: str) -> str:
    if entry.startswith("/"):
        return entry
    path = entry[len("unix:"):]
    return path[2:] if path.startswith("//") else path   # unix:///abs and unix:/abs


def _resolve(entry: str, flag: str) -> list[tuple[str, int]]:
    host, sep, port = entry.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise LayaError(Kind.INVALID, "%s: %r is not HOST:PORT, unix:/path or dns:///NAME:PORT" % (flag, entry))
    try:
        return [(str(ipaddress.ip_address(host)), int(port))]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM) or \
            socket.getaddrinfo(host, int(port), socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        try:
            infos = socket.getaddrinfo(host, int(port), socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            raise LayaError(Kind.INVALID, "%s: cannot resolve %r: %s" % (flag, host, e)) from None
    return [(info[4][0], int(port)) for info in infos]
