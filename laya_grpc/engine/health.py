"""The gateway's `/health` facts, read from what it observes of its backends right now.

Upstream's fields (ready, loaded, device, cpu_fallbacks, ...) come first, then ours: each
checkpoint's state, device, kernels and timings, each backend process's state and restarts seen.
"""
from __future__ import annotations

from laya_proto.v1 import status_pb2

S = status_pb2


def health_payload(watch) -> dict:
    """Live facts for /health from the backends' watch (backends.py `BackendWatch`); the HTTP app adds
    `ready` from the gateway's Readiness and fills upstream's remaining fields from these."""
    st = watch.inference.status
    cps = list(st.checkpoints) if st is not None else []
    loaded = [c for c in cps if c.state == S.STATE_READY]
    devices = {c.name: c.device for c in loaded}
    actual = next(iter(devices.values()), None)
    preference = cps[0].device_requested if cps else "unknown"
    return {
        "loaded": [c.name for c in loaded],
        "revisions": {c.name: c.revision for c in loaded},
        "device": actual or preference,
        "device_is_preference": actual is None,
        "checkpoint_devices": devices,
        # upstream counts per-request GPU->CPU retries here; we never retry on another device
        "cpu_fallbacks": {c.name: {"count": 0, "last_reason": None} for c in loaded},
        "checkpoints": {c.name: {"state": S.State.Name(c.state).removeprefix("STATE_").lower(), "device": c.device, "dtype": c.dtype,
                                 "backend": c.backend, "kernels": c.kernels, "rows": c.row_layout,
                                 "revision": c.revision, "sha256": c.sha256,
                                 "warmup_ms": round(c.warmup_ms, 1), "load_ms": round(c.load_ms, 1),
                                 "device_requested": c.device_requested, "device_fallback": c.device_fallback,
                                 "detail": c.detail} for c in cps},
        "preparing": [c.name for c in cps if c.state == S.STATE_PREPARING],
        "services": {("%s@%s" % (b.service, b.address)): {"state": S.State.Name(b.state).removeprefix("STATE_").lower(),
                                                          "detail": b.detail, "restarts_seen": b.downs}
                     for b in watch.backends},
        "queue_depth": st.queue_depth if st is not None else 0,
    }
