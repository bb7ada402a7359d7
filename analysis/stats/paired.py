"""The paired test a study decides with, and its exact power.

The seed is the unit. Each seed's paired effect (treatment minus control, averaged over the eval
problems or the window's steps first) is one observation; with ``n`` seeds the test has ``n - 1``
degrees of freedom:

* **difference**: the paired t interval ``mean +- t_{1 - a/2, n-1} sd / sqrt(n)`` at level
  ``1 - a``; ``reproduced`` when it lies on the predicted side of 0, ``contradicted`` when on the
  other side (a two-sided test: each false verdict has rate ``a / 2``);
* **equivalence** (TOST, Schuirmann 1987): the ``1 - 2a`` paired t interval; ``reproduced`` when
  it lies inside ``(-margin, margin)``, ``contradicted`` when it lies entirely outside.

Power is computed for that test, exactly:

* paired t: the noncentral t, ``P(|T'| > t_{1-a/2, n-1})``, ``T' ~ t_{n-1}(delta sqrt(n) / sd)``;
* TOST: the integral over the sample sd ``s`` (``(n-1) s^2 / sd^2 ~ chi^2_{n-1}``) of
  ``P(|mean - theta'| < margin - t_{1-a, n-1} s / sqrt(n))`` with ``mean ~ N(theta, sd^2 / n)``
  (Phillips 1990, J. Pharmacokin. Biopharm. 18:137; ``scipy.integrate.quad``).

The ablation report and :mod:`analysis.compare` take their paired t p-value, their t interval over
seeds and their Welch test from here too. Pure numpy / scipy, vectorised over simulated studies.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import integrate, optimize, stats

# verdict codes of the vectorised functions
INCONCLUSIVE, REPRODUCED, CONTRADICTED = 0, 1, 2
VERDICT_NAMES = {INCONCLUSIVE: "inconclusive", REPRODUCED: "reproduced", CONTRADICTED: "contradicted"}
MIN_SEEDS = 3  # a new registration needs at least this many seeds per arm
POWER_TARGET = 0.8


# ----------------------------------------------------------------------------------- the test
def interval_level(kind: str, alpha: float) -> float:
    """The two-sided level of the interval that decides: ``1 - alpha`` (difference), ``1 - 2 alpha``
    (equivalence, TOST)."""
    return 1 - 2 * alpha if kind == "equivalence" else 1 - alpha


def t_interval(per_seed, level) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mean, lo, hi)`` of the paired t interval over the last axis of ``per_seed``.

    Args:
        per_seed: ``[..., n]`` per-seed paired effects.
        level: two-sided level(s), broadcast against the leading axes ``[...]``.

    Returns:
        three arrays ``[...]``; ``lo`` and ``hi`` are nan when ``n < 2``. A zero sd gives the point
        ``[mean, mean]`` (the t statistic is infinite unless the mean is 0).
    """
    x = np.asarray(per_seed, dtype=float)
    n = x.shape[-1]
    mean = x.mean(axis=-1)
    if n < 2:
        nan = np.full(mean.shape, np.nan)
        return mean, nan, nan
    sd = x.std(axis=-1, ddof=1)
    half = stats.t.ppf(1 - (1 - np.asarray(level, dtype=float)) / 2, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def decide(test: dict, lo, hi) -> np.ndarray:
    """Verdict codes (``INCONCLUSIVE`` / ``REPRODUCED`` / ``CONTRADICTED``) of intervals ``[lo, hi]``
    (arrays of one shape) under the rule of the module docstring; nan bounds: inconclusive."""
    lo, hi = np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)
    out = np.full(np.broadcast(lo, hi).shape, INCONCLUSIVE)
    ok = ~(np.isnan(lo) | np.isnan(hi))
    if test["kind"] == "difference":
        s = test["sign"]
        out[ok & (s * lo > 0) & (s * hi > 0)] = REPRODUCED
        out[ok & (s * lo < 0) & (s * hi < 0)] = CONTRADICTED
    else:
        m = test["margin"]
        out[ok & (-m < lo) & (hi < m)] = REPRODUCED
        out[ok & ((lo >= m) | (hi <= -m))] = CONTRADICTED
    return out


def paired_t_p(d) -> float:
    """Two-sided p-value of the paired t-test that the per-seed differences ``d`` (``[n]``) have mean 0
    (``scipy.stats.ttest_1samp``); nan with fewer than 2 seeds or no spread."""
    d = np.asarray(d, dtype=float)
    if len(d) < 2 or np.std(d, ddof=1) == 0:
        return math.nan
    return float(stats.ttest_1samp(d, 0.0).pvalue)


def t_ci(values, conf: float = 0.95) -> tuple[float, float, float, int]:
    """Mean and two-sided Student-t CI ``(mean, lo, hi, n)`` of ``values`` (a column over seeds); NaNs
    and non-numbers dropped, CI NaN if n < 2."""
    x = np.asarray(pd.to_numeric(pd.Series(values), errors="coerce").dropna(), dtype=float)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan, 0
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan, n
    half = float(stats.t.ppf(0.5 + conf / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half, n


def welch_p(a, b) -> tuple[float, float]:
    """Welch's unequal-variance t-test ``(t, p)`` of two unpaired samples (``scipy.stats.ttest_ind``).

    NaN when either side has n < 2 or both samples are constant (zero variance).
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return math.nan, math.nan  # undefined without at least one non-constant sample
    res = stats.ttest_ind(a, b, equal_var=False)
    return float(res.statistic), float(res.pvalue)


# ----------------------------------------------------------------------------------- power
def t_power(sd: float, delta: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t-test over ``n`` seeds at level ``alpha`` when the per-seed
    effects are N(``delta``, ``sd``^2) (noncentral t, exact). At ``sd`` 0 its limit: 1 for a nonzero
    ``delta`` (the t statistic is infinite), nan for ``delta`` 0."""
    if sd == 0:
        return 1.0 if delta else math.nan
    df, crit = n - 1, stats.t.ppf(1 - alpha / 2, n - 1)
    nc = delta / (sd / math.sqrt(n))
    lower = float(np.nan_to_num(stats.nct.cdf(-crit, df, nc)))  # scipy gives nan for a negligible tail
    return float(stats.nct.sf(crit, df, nc)) + lower


def tost_power(sd: float, margin: float, n: int, alpha: float = 0.05, theta: float = 0.0) -> float:
    """Exact power of TOST (both one-sided paired t-tests at ``alpha``) with ``n`` seeds to show
    ``|effect| < margin`` when the per-seed effects are N(``theta``, ``sd``^2): the integral over the
    sample sd of the module docstring (Phillips 1990). 0 when ``n < 2``."""
    if n < 2 or not sd > 0:
        return 0.0
    df, tc, rn = n - 1, stats.t.ppf(1 - alpha, n - 1), math.sqrt(n)
    se = sd / rn
    u_max = margin * rn / (tc * sd)  # s / sd beyond which the TOST region is empty

    def inner(u):  # u = s / sd; density of u: chi_df scaled by 1/sqrt(df)
        w = margin - tc * u * sd / rn
        p = stats.norm.cdf((w - theta) / se) - stats.norm.cdf((-w - theta) / se)
        return p * stats.chi.pdf(u * math.sqrt(df), df) * math.sqrt(df)

    # the chi density's bulk (quad could step over a narrow peak at large n)
    a = stats.chi.ppf(1e-14, df) / math.sqrt(df)
    b = min(u_max, stats.chi.isf(1e-14, df) / math.sqrt(df))
    if b <= a:
        return 0.0
    val, _ = integrate.quad(inner, a, b, limit=200, epsabs=1e-12, epsrel=1e-10)
    return float(min(1.0, max(0.0, val)))


def deciding_power(test: dict, sd: float, n: int) -> float:
    """Power of the study's deciding test with ``n`` seeds at spread ``sd``: paired t for ``delta``
    (difference), TOST at a true effect of 0 (equivalence)."""
    alpha = test.get("alpha", 0.05)
    if test["kind"] == "difference":
        return t_power(sd, test["delta"], n, alpha)
    return tost_power(sd, test["margin"], n, alpha)


def seeds_for_power(test: dict, sd: float, target: float = POWER_TARGET, cap: int = 10_000) -> int:
    """Smallest ``n >= 2`` whose exact power (:func:`deciding_power`) reaches ``target``; ``cap`` when none
    below it does."""
    lo, hi = 2, 2
    while deciding_power(test, sd, hi) < target:  # doubling, then bisection: power rises with n
        lo, hi = hi + 1, hi * 2
        if hi >= cap:
            return cap if deciding_power(test, sd, cap) < target else _first(test, sd, target, lo, cap)
    return _first(test, sd, target, lo, hi)


def _first(test, sd, target, lo, hi) -> int:
    while lo < hi:
        mid = (lo + hi) // 2
        if deciding_power(test, sd, mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def min_detectable(sd: float, n: int, alpha: float = 0.05, target: float = POWER_TARGET) -> float:
    """The difference the two-sided paired t-test over ``n`` seeds detects with exactly ``target``
    power (root of the noncentral-t power in ``delta``); 0 at ``sd`` 0."""
    if sd == 0:
        return 0.0
    return float(optimize.brentq(lambda d: t_power(sd, d, n, alpha) - target, 1e-12 * sd, 1e4 * sd, xtol=1e-14 * sd))


def sd_interval(sd: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The ``level`` interval of the true sd from a sample sd over ``n`` seeds: ``(n-1) s^2 / sd^2 ~
    chi^2_{n-1}`` (normal per-seed effects)."""
    df = n - 1
    a = (1 - level) / 2
    return (sd * math.sqrt(df / stats.chi2.ppf(1 - a, df)), sd * math.sqrt(df / stats.chi2.ppf(a, df)))
