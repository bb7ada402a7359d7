"""Bootstrap intervals: secondary to the paired t of :mod:`analysis.stats.paired`.

* :func:`two_level_bootstrap`: means of ``[seeds, problems]`` values over resamples of seeds and then
  of problems (or window steps). The ablation report's intervals, and the study reports' secondary
  interval. It treats the problems as units beside the seeds, so it is miscalibrated at a few seeds:
  a study's verdict is the paired t's, never this one's.
* :func:`paired_bootstrap_ci`: the percentile interval of the mean of paired differences over
  resamples of the pairs (:mod:`analysis.compare`, the plots' bands).
"""

from __future__ import annotations

import math

import numpy as np


def two_level_bootstrap(values: np.ndarray, n_boot: int, rng) -> np.ndarray:
    """Means of ``values`` ``[seeds, problems]`` over ``n_boot`` two-level resamples (seeds with
    replacement, then problems with replacement, the same problem draw for every seed).

    Returns:
        ``[n_boot]`` resampled means.
    """
    S, N = values.shape
    si = rng.integers(0, S, size=(n_boot, S))
    pj = rng.integers(0, N, size=(n_boot, N))
    out = np.empty(n_boot)
    for b in range(n_boot):
        out[b] = values[np.ix_(si[b], pj[b])].mean()
    return out


def percentile_interval(draws: np.ndarray) -> tuple[float, float]:
    """The 95% percentile interval ``(lo, hi)`` of bootstrap ``draws``."""
    lo, hi = np.quantile(draws, [0.025, 0.975])
    return float(lo), float(hi)


def bootstrap_p(draws: np.ndarray) -> float:
    """Two-sided bootstrap p-value of "mean 0": twice the smaller share of ``draws`` on either side of 0,
    at most 1."""
    return min(1.0, 2 * min(float((draws <= 0).mean()), float((draws >= 0).mean())))


def paired_bootstrap_ci(diffs, n_boot: int = 10000, conf: float = 0.95, seed: int = 0):
    """Percentile bootstrap CI ``(lo, hi)`` of the mean of paired differences ``diffs`` (``[pairs]``,
    NaNs dropped; NaN if fewer than 2 pairs), resampling the pairs with RNG ``seed``."""
    d = np.asarray(diffs, dtype=float)
    d = d[~np.isnan(d)]
    if len(d) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - conf) / 2, (1 + conf) / 2])
    return float(lo), float(hi)
