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
    """How long a forward of some work (tokens, or tokens as a runner runs them) takes, per
    checkpoint, as forwards showed it: a fixed cost a forward plus milliseconds per unit of work,
    fitted to the forwards seen by exponentially weighted least squares, so a host that gets
    loaded shrinks the work that fits a turn, and recovers. The inference batcher sizes its
    forwards with it: a turn is the work whose time beyond the fixed cost is about one turn.

    Why not all of a forward's time read as work: a forward also pays for what its rows do not
    change (launches, thread wake-ups, on a shared CPU the scheduler's delays). Counted per unit,
    that cost makes a smaller forward look slower per unit, so the next forwards are cut smaller
    still, whose fixed cost then weighs more: on a loaded CPU host, down to one row a forward, each
    paying the whole fixed cost again (a large request took a forward per row). No cut saves that
    cost, so the turn does not count it.

    The fit needs forwards of different sizes (their work spread by SPREAD of its mean); until
    then, and while the fixed cost it finds is small beside a turn (under half of one: read as
    work, it only makes forwards a little shorter, and a slope between two sizes is noisier than
    their ratio), all of a forward's time counts as work, as a line through zero."""
    WEIGHT = 0.3
    SPREAD = 0.1

    def __init__(self) -> None:
        self._fits: dict[str, list[float]] = {}   # checkpoint -> [mean work, mean ms, var of work, cov]

    def observe(self, checkpoint: str, ms: float, units: float) -> None:
        fit = self._fits.get(checkpoint)
        if fit is None:
            self._fits[checkpoint] = [units, ms, 0.0, 0.0]
            return
        w = self.WEIGHT
        du, dms = units - fit[0], ms - fit[1]
        fit[0] += w * du
        fit[1] += w * dms
        fit[2] = (1 - w) * (fit[2] + w * du * du)
        fit[3] = (1 - w) * (fit[3] + w * du * dms)

    def ms_per_unit(self, checkpoint: str) -> float | None:
        """The time a unit of work adds to a forward; None before any forward was seen, or when the
        forwards showed no time growing with their work (nothing a cut would save)."""
        fit = self._fits.get(checkpoint)
        if fit is None:
            return None
        units, ms, var, cov = fit
        per = ms / units
        if var > (self.SPREAD * units) ** 2:
            slope = cov / var
            if ms - slope * units >= TURN_MS / 2:   # a fixed cost of half a turn or more (so slope < per)
                per = slope
        return per if per > 0 else None

    def units_in(self, checkpoint: str, ms: float) -> float | None:
        """Units of work that add about `ms` to a forward; None as `ms_per_unit`."""
        per = self.ms_per_unit(checkpoint)
        return None if per is None else ms / per
