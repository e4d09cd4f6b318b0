"""How long one turn on the device lasts: the fairness unit that the gateway and the inference
service share.

A request larger than a turn is cut by the gateway into chunks of about one turn of forward work
(engine/coalesce.py), and the inference service's batcher merges queued rows into one forward
pass only up to about one turn (inference/batcher.py). So a small request arriving behind any
number of large ones waits about one turn, and rows whose client went away stop costing device
time within about one turn of the cancel: a forward that already runs cannot be interrupted, and
it is never longer than that.

50 ms keeps the per-call overhead (about 1 ms a gateway round trip) small beside a chunk while a
small request stays well under the 1 s a waiting client notices.
"""
TURN_MS = 50.0


class DeviceSpeed:
    """Milliseconds per unit of forward work (tokens, or tokens as a runner runs them), per
    checkpoint, as forwards showed it: an exponentially weighted average, so a host that gets
    loaded shrinks the work that fits a turn, and recovers. The gateway sizes its chunks with it,
    the inference batcher its merges."""
    WEIGHT = 0.3

    def __init__(self) -> None:
        self._ms_per_unit: dict[str, float] = {}

    def observe(self, checkpoint: str, ms: float, units: float) -> None:
        per = ms / units
        old = self._ms_per_unit.get(checkpoint)
        self._ms_per_unit[checkpoint] = per if old is None else old + self.WEIGHT * (per - old)

    def units_in(self, checkpoint: str, ms: float) -> float | None:
        """Units of work that take about `ms`; None before any forward was seen."""
        per = self._ms_per_unit.get(checkpoint)
        return None if per is None else ms / per
