"""How long one turn on the device lasts: the fairness unit of the inference batcher.

The batcher (inference/batcher.py) runs at most about one turn of forward work at a time: a
request larger than that runs in parts, one a turn, between other requests. So a small request
arriving behind any number of large ones waits about one turn, and rows whose client went away
stop costing device time within about one turn of the cancel: a forward that already runs cannot
be interrupted, and it is never longer than that.

50 ms keeps the per-forward overhead small beside a turn's work while a small request stays well
under the 1 s a waiting client notices.
"""
TURN_MS = 50.0


class DeviceSpeed:
    """Milliseconds per unit of forward work (tokens, or tokens as a runner runs them), per
    checkpoint, as forwards showed it: an exponentially weighted average, so a host that gets
    loaded shrinks the work that fits a turn, and recovers. The inference batcher sizes its
    forwards with it."""
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
