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

from ..errors import CheckpointError

CONFIG_FILE = "rl_agent_config.json"
QTYPE_NAMES = ("choice", "score", "noul")   # index = qtype id fed to the network
TEMP_MIN = 0.5
TEMP_MAX = 5.0
DEFAULT_TEMPERATURE = (1.0, 1.0, 1.0)   # upstream's value when a config has no `temperature`


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


def temperature_rejected(raw: Any, applied: float) -> bool:
    """Upstream `common.temperature_rejected`: whether `raw` is not the number the clamp turned into
    `applied` (a bool always is)."""
    if isinstance(raw, bool):
        return True
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return True
    return value != applied


def raw_temperatures(rl_agent_config: dict, path: str = CONFIG_FILE) -> tuple[list, dict]:
    """`temperature` and `temperature_by_options` as shipped (upstream's defaults when absent).

    Their shape is checked here, once for every reader: `open_checkpoint` passes the file's full
    path so the CheckpointError names it; a config already in memory names the file alone.
    """
    raw = rl_agent_config.get("temperature", list(DEFAULT_TEMPERATURE))
    if not isinstance(raw, (list, tuple)) or len(raw) != 3:
        raise CheckpointError(path, "'temperature' must be a list of 3 floats [choice, score, noul], found %r"
                              % (raw,))
    by_raw = rl_agent_config.get("temperature_by_options", {})
    if not isinstance(by_raw, dict):
        raise CheckpointError(path, "'temperature_by_options' must be a mapping bucket -> float, found %r"
                              % (by_raw,))
    return list(raw), by_raw


@dataclass(frozen=True)
class Temperatures:
    """Clamped temperatures: one per question type, overridden per option-count bucket."""
    per_type: tuple[float, float, float]
    by_options: dict[str, float]

    @classmethod
    def from_config(cls, rl_agent_config: dict) -> "Temperatures":
        raw, by_raw = raw_temperatures(rl_agent_config)
        per_type = tuple(clamp_temperature(t) for t in raw)
        by_options = {k: clamp_temperature(v) for k, v in by_raw.items()}
        # Same entries, order and text as upstream's load-time warning.
        entries = [(k, v, by_options[k]) for k, v in by_raw.items()]
        entries += [("temperature[%d]" % i, t, per_type[i]) for i, t in enumerate(raw)]
        rejected = ["%s=%r -> %g" % (name, r, applied) for name, r, applied in entries
                    if temperature_rejected(r, applied)]
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

    def to_proto(self, m) -> None:
        """Into a `laya_proto.v1.Temperatures` (duck-typed: core imports no generated code)."""
        m.choice, m.score, m.noul = self.per_type
        m.by_options.update(self.by_options)

    @classmethod
    def from_proto(cls, m) -> "Temperatures":
        return cls(per_type=(m.choice, m.score, m.noul), by_options=dict(m.by_options))
