"""Percentiles and the paired A/B ratio with a bootstrap interval (numpy only)."""
from __future__ import annotations

import numpy as np


def pct(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if len(values) else float("nan")


def summary_ms(samples_s) -> dict:
    ms = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {"p50_ms": pct(ms, 50), "p95_ms": pct(ms, 95), "mean_ms": float(ms.mean()) if len(ms) else float("nan"),
            "n": int(len(ms))}


def paired_ratio(a_s, b_s, n_boot: int = 2000, seed: int = 0) -> dict:
    """Median of per-pair a/b with a 95% percentile-bootstrap interval (pairs resampled together)."""
    r = np.asarray(a_s, dtype=np.float64) / np.asarray(b_s, dtype=np.float64)
    rng = np.random.default_rng(seed)
    boots = np.median(r[rng.integers(0, len(r), size=(n_boot, len(r)))], axis=1)
    return {"median_ratio": float(np.median(r)), "ci95_lo": float(np.percentile(boots, 2.5)),
            "ci95_hi": float(np.percentile(boots, 97.5)), "pairs": int(len(r))}
