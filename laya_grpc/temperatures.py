"""Per-question temperatures, read from `rl_agent_config.json` the way upstream laya 0.4.15 does.

Upstream keeps the raw values for inspection but only ever applies clamped ones: a checkpoint may
ship a sharpening temperature (English `choice:11+` = 0.1006) or a non-number, and those are
replaced at load with a `RuntimeWarning` naming each entry (`Agent.__init__`, `clamp_temperature`).
The bucket names are `common.temp_bucket`'s: `<type>:2`, `:3-5`, `:6-10`, `:11+`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from .errors import Kind, LayaError

QTYPE_NAMES = ("choice", "score", "noul")   # index = qtype id fed to the network
TEMP_MIN = 0.5
TEMP_MAX = 5.0


def option_bucket(qtype: int, k: int) -> str:
    """Upstream's option-count bucket name, e.g. `choice:3-5` (temperatures and min_confidence maps)."""
    size = "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"
    return "%s:%s" % (QTYPE_NAMES[int(qtype)], size)


def clamp_temperature(t: Any, lo: float = TEMP_MIN, hi: float = TEMP_MAX) -> float:
    """`t` confined to [lo, hi]; a bool, NaN, inf or non-number becomes the neutral 1.0."""
    if isinstance(t, bool):
        return 1.0
    try:
        t = float(t)
    except (TypeError, ValueError):
        return 1.0
    if t != t or t in (float("inf"), float("-inf")):
        return 1.0
    return min(hi, max(lo, t))


def _rejected(raw: Any, applied: float) -> bool:
    """Whether `raw` is not the number the clamp turned into `applied` (a bool always is)."""
    if isinstance(raw, bool):
        return True
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return True
    return value != applied


@dataclass(frozen=True)
class Temperatures:
    """Clamped temperatures: one per question type, overridden per option-count bucket."""
    per_type: tuple[float, float, float]
    by_options: dict[str, float]

    @classmethod
    def from_config(cls, rl_agent_config: dict) -> "Temperatures":
        raw = rl_agent_config.get("temperature", [1.0, 1.0, 1.0])
        if not isinstance(raw, (list, tuple)) or len(raw) != 3:
            raise LayaError(Kind.CHECKPOINT, "rl_agent_config.json: temperature must be a list of 3 "
                                             "floats, got %r" % (raw,))
        by_raw = rl_agent_config.get("temperature_by_options", {})
        if not isinstance(by_raw, dict):
            raise LayaError(Kind.CHECKPOINT, "rl_agent_config.json: temperature_by_options must be a "
                                             "mapping of bucket -> float, got %r" % (by_raw,))
        per_type = tuple(clamp_temperature(t) for t in raw)
        by_options = {k: clamp_temperature(v) for k, v in by_raw.items()}
        # Same entries, order and text as upstream's load-time warning.
        entries = [(k, v, by_options[k]) for k, v in by_raw.items()]
        entries += [("temperature[%d]" % i, t, per_type[i]) for i, t in enumerate(raw)]
        rejected = ["%s=%r -> %g" % (name, r, applied) for name, r, applied in entries
                    if _rejected(r, applied)]
        if rejected:
            warnings.warn(
                "laya: this checkpoint ships invalid temperatures or values outside [%g, %g]; "
                "using %s. Treat confidence from the affected entries as uncalibrated."
                % (TEMP_MIN, TEMP_MAX, ", ".join(rejected)),
                RuntimeWarning, stacklevel=2)
        return cls(per_type=per_type, by_options=by_options)

    def for_question(self, qtype: int, k: int) -> float:
        """The temperature dividing the logits of a `qtype` question with `k` option markers."""
        return self.by_options.get(option_bucket(qtype, k), self.per_type[qtype])
