"""Group-sequential boundaries of the paired t, and the sequential rule over simulated studies.

A sequential study looks at its first seeds, then adds seeds per look until the rule of
:mod:`analysis.stats.paired` decides at the look's nominal level. The boundaries
(:func:`nominal_levels`) are Lan-DeMets alpha-spending functions (Lan and DeMets 1983,
Biometrika 70:659) on the information fraction ``t_k = n_k / n_max``:

* ``obrien_fleming``: ``alpha(t) = 2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))``;
* ``pocock``: ``alpha(t) = alpha ln(1 + (e - 1) t)``;
* ``bonferroni``: ``alpha / K`` at each of the ``K`` looks (no spending computation).

The boundaries are those of the statistic that decides, the paired t with ``n_k - 1`` df at look
``k``, not of a known-variance z (Jennison and Turnbull 2000, *Group Sequential Methods*, sec. 3.8,
discuss the choices for an unknown variance). Under the null the looks' t statistics have a joint
law free of the per-seed sd. It is simulated once per design (:data:`T_STUDIES` studies of iid
N(0, 1) per-seed effects, seed :data:`T_SEED`; the designs in use are kept in the committed table
:data:`T_TABLE`): the first look's critical value is the exact ``t_{n_1 - 1}`` quantile of the first
spend, and each later ``c_k`` is chosen so that the simulated probability of first crossing
``|T_k| > c_k`` at look ``k`` equals the spending function's increment. Each ``c_k`` is returned as
the nominal two-sided level ``2 P(t_{n_k - 1} > c_k)``, so the t interval at level ``1 - level`` is
the boundary. The boundary's own Monte-Carlo error in the total it spends is about
``sqrt(total / T_STUDIES)`` (7e-5 at 0.05). ``tests/test_sequential_levels.py`` checks, on
independent draws, that each false verdict (difference test, TOST at the margin, one comparison of
a 7-arm family) occurs at its nominal rate, and that the z levels of the same spending
(:func:`z_nominal_levels`: the recursive integration of Armitage, McPherson and Rowe 1969, Jennison
and Turnbull ch. 19) applied to the t interval at ``2 (1 - Phi(c_k))`` (their sec. 3.8
"significance level" approximation) exceed it at 3-12 seeds.

TOST uses the same boundaries at the two-sided total ``2 alpha``: at a true effect on the margin
``theta = margin`` its decision is a crossing of ``T = (mean - margin) / se``, "reproduced" below
(``-c_k``), "contradicted" above (``c_k``), so each tail has rate ``alpha`` (at most ``alpha`` when
the other margin is within reach of the interval).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from analysis.stats.paired import INCONCLUSIVE, decide, t_interval

BOUNDARIES = ("obrien_fleming", "pocock", "bonferroni")
# the t boundaries' simulation (nominal_levels): null studies per design and its seed (the checks use others)
T_STUDIES = 10_000_000
T_SEED = 20_261_206
# the derived levels of the designs the studies and the fast tests use (write_t_table): the same numbers
# as a derivation now, kept so that reports do not depend on numpy's normal stream or on seconds of work
T_TABLE = Path(__file__).with_name("t_boundaries.json")


def look_sizes(first: int, add: int, max_seeds: int) -> list[int]:
    """Seeds at each look: ``first, first + add, ...``, the last capped at ``max_seeds``."""
    out = list(range(first, max_seeds, add)) if add > 0 and first < max_seeds else []
    return [*out, max_seeds]


def _spent(boundary: str, t: np.ndarray, total: float) -> np.ndarray:
    if boundary == "obrien_fleming":
        return 2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - total / 2) / np.sqrt(t))
    if boundary == "pocock":
        return total * np.log(1 + (math.e - 1) * t)
    raise ValueError(f"boundary {boundary!r}: expected one of {BOUNDARIES}")


def _check_design(boundary: str, looks) -> np.ndarray:
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary {boundary!r}: expected one of {BOUNDARIES}")
    n = np.asarray(looks, dtype=float)
    if len(n) == 0 or np.any(np.diff(n) <= 0) or n[0] < 2 or np.any(n != np.round(n)):
        raise ValueError(f"looks {looks}: expected increasing seed counts of at least 2")
    return n


def nominal_levels(boundary: str, looks: list[int], total: float) -> np.ndarray:
    """Two-sided nominal alpha of the paired t interval at each look, for a two-sided total ``total``
    (the module docstring's simulated t boundaries): the committed table's entry for the design
    (:data:`T_TABLE`), else derived now (:func:`derive_t_levels`, seconds; cached in the process).

    Args:
        boundary: ``obrien_fleming``, ``pocock`` (Lan-DeMets spending) or ``bonferroni``.
        looks: seeds at each look (increasing, >= 2); information fraction ``looks / looks[-1]``.
        total: the fixed design's two-sided alpha (difference: ``alpha``; equivalence: ``2 alpha``).

    Returns:
        ``[K]`` levels ``2 P(t_{n_k - 1} > c_k)`` of the t boundaries ``c_k``.

    Raises:
        ValueError: an unknown boundary, or looks not increasing integers >= 2.
    """
    n = _check_design(boundary, looks)
    if boundary == "bonferroni":
        return np.full(len(n), total / len(n))
    looks_t, total = tuple(int(x) for x in n), float(total)
    table = _t_table()
    key = design_key(boundary, looks_t, total)
    if key in table["designs"]:
        return np.asarray(table["designs"][key], dtype=float)
    return np.asarray(derive_t_levels(boundary, looks_t, total))


def design_key(boundary: str, looks, total: float) -> str:
    """The design's key in :data:`T_TABLE`: ``"<boundary> <looks, comma-separated> <total>"``, the
    total to 12 significant digits (``1 - 0.95`` and ``0.05`` are one design)."""
    return f"{boundary} {','.join(str(int(x)) for x in looks)} {float(total):.12g}"


@functools.lru_cache(maxsize=1)
def _t_table() -> dict:
    return json.loads(T_TABLE.read_text()) if T_TABLE.exists() else {"designs": {}}


def null_abs_t(looks, studies: int, seed: int, chunk: int = 1_000_000) -> np.ndarray:
    """``[studies, K]`` ``|T_k|`` (float32) of simulated null studies: the paired t statistic
    ``|mean| / (sd / sqrt(n_k))`` of the first ``looks[k]`` of ``looks[-1]`` iid N(0, 1) per-seed
    effects, sums in float64, drawn in chunks of ``chunk`` studies (``[seeds, chunk]`` each)."""
    out = np.empty((studies, len(looks)), dtype=np.float32)
    rng = np.random.default_rng(seed)
    for a in range(0, studies, chunk):
        x = rng.standard_normal((int(looks[-1]), min(chunk, studies - a)))
        s, q = np.zeros(x.shape[1]), np.zeros(x.shape[1])
        for j, row in enumerate(x, start=1):
            s += row
            q += row * row
            if j in looks:
                var = (q - s * s / j) / (j - 1)  # float64: no cancellation worth the name at N(0, 1) scale
                out[a : a + x.shape[1], list(looks).index(j)] = np.abs(s) / np.sqrt(j * var)
    return out


@functools.lru_cache(maxsize=64)
def derive_t_levels(boundary: str, looks: tuple, total: float, studies: int = T_STUDIES,
                    seed: int = T_SEED) -> tuple:
    """The t boundaries of one design as nominal levels (module docstring), from ``studies`` null
    studies drawn with ``seed``: the first look's ``c_1`` is the exact t quantile of the first spend;
    each later ``c_k`` the quantile of ``|T_k|`` over the studies still running that leaves
    ``spend_k x studies`` of them above it."""
    n = np.asarray(looks, dtype=float)
    spend = np.diff(_spent(boundary, n / n[-1], total), prepend=0.0)
    t = null_abs_t(looks, studies, seed)
    alive = np.ones(studies, dtype=bool)
    c = [float(stats.t.isf(spend[0] / 2, n[0] - 1))]
    for k in range(1, len(n)):
        alive &= t[:, k - 1] <= c[-1]
        left = t[alive, k]
        c.append(float(np.quantile(left.astype(float), 1 - spend[k] * studies / len(left))) if len(left) else 0.0)
    return tuple(float(x) for x in 2 * stats.t.sf(np.asarray(c), n - 1))


def write_t_table(designs=(), path: Path | None = None) -> Path:
    """(Re)derive every design of the table at ``path`` (default :data:`T_TABLE`) and the
    ``(boundary, looks, total)`` ``designs`` given, and write it (``studies``, ``seed`` and numpy's
    version beside the levels)."""
    path = path or T_TABLE
    old = json.loads(path.read_text())["designs"] if path.exists() else {}
    keys = {design_key(*d): d for d in designs}
    for key in old:
        b, lk, tot = key.split(" ")
        keys.setdefault(key, (b, tuple(int(x) for x in lk.split(",")), float(tot)))
    table = {"studies": T_STUDIES, "seed": T_SEED, "numpy": np.__version__,
             "designs": {k: list(derive_t_levels(b, tuple(lk), tot)) for k, (b, lk, tot) in sorted(keys.items())}}
    path.write_text(json.dumps(table, indent=1) + "\n")
    _t_table.cache_clear()
    return path


def z_nominal_levels(boundary: str, looks: list[int], total: float, grid: int = 2001) -> np.ndarray:
    """The z boundaries of the same spending: two-sided levels ``2 (1 - Phi(c_k))`` from the
    recursive numerical integration on the score ``S_k = Z_k sqrt(n_k)`` (Armitage, McPherson and
    Rowe 1969; Jennison and Turnbull 2000, ch. 19; Simpson's rule on ``grid`` points). Exact for a
    known-variance z statistic; the t statistic at these levels runs above ``total`` at 3-12 seeds
    (module docstring), so the verdicts use :func:`nominal_levels`.

    Raises:
        ValueError: as :func:`nominal_levels`.
    """
    n = _check_design(boundary, looks)
    if boundary == "bonferroni":
        return np.full(len(n), total / len(n))
    spend = np.diff(_spent(boundary, n / n[-1], total), prepend=0.0)
    c = [stats.norm.ppf(1 - spend[0] / 2)]
    x = np.linspace(-c[0], c[0], grid) * math.sqrt(n[0])
    w = _simpson(x)
    dens = stats.norm.pdf(x / math.sqrt(n[0])) / math.sqrt(n[0])
    for k in range(1, len(n)):
        sdk, rik = math.sqrt(n[k] - n[k - 1]), math.sqrt(n[k])

        def exit_prob(ck):
            b = ck * rik
            tail = stats.norm.cdf((-b - x) / sdk) + stats.norm.sf((b - x) / sdk)
            return float(np.sum(w * dens * tail))

        ck = optimize.brentq(lambda z: exit_prob(z) - spend[k], 1e-6, 40.0, xtol=1e-12) if spend[k] > 0 else np.inf
        c.append(ck)
        if k < len(n) - 1:
            y = np.linspace(-ck, ck, grid) * rik
            kern = stats.norm.pdf((y[:, None] - x[None, :]) / sdk) / sdk
            dens, x, w = kern @ (w * dens), y, _simpson(y)
    return 2 * stats.norm.sf(np.asarray(c))


def _simpson(x: np.ndarray) -> np.ndarray:
    """Composite Simpson weights on an odd-sized uniform grid."""
    h = x[1] - x[0]
    w = np.ones(len(x))
    w[1:-1:2], w[2:-1:2] = 4, 2
    return w * h / 3


def sequential(per_seed, test: dict, looks: list[int], levels) -> dict:
    """The sequential rule over studies: at each look the t interval of the first ``n_k`` seeds at
    the nominal level ``1 - levels[k]``; a study stops at its first decided look (or the last look).

    Args:
        per_seed: ``[studies, seeds]`` per-seed paired effects, seeds in the order they are added
            (``seeds >= looks[-1]``, or fewer: looks beyond the seeds present are not taken).
        test: the study's ``test`` (kind, sign / margin).
        looks: seeds at each look; levels: ``[K]`` nominal two-sided alphas of the interval
            (:func:`nominal_levels`; the fixed design is ``looks=[n]`` with ``levels=[1 - interval
            level]``).

    Returns:
        ``lo``, ``hi``, ``code``: ``[studies, K']`` per look taken (K' = looks with enough seeds);
        ``stop``: ``[studies]`` index of the deciding (or last) look; ``verdict``, ``seeds_used``,
        ``lo_final``, ``hi_final``, ``mean_final``: ``[studies]`` at that look.
    """
    x = np.atleast_2d(np.asarray(per_seed, dtype=float))
    taken = [k for k, n in enumerate(looks) if n <= x.shape[1]]
    S, K = x.shape[0], len(taken)
    lo, hi, mean = (np.full((S, K), np.nan) for _ in range(3))
    code = np.zeros((S, K), dtype=int)
    for k in taken:
        mean[:, k], lo[:, k], hi[:, k] = t_interval(x[:, :looks[k]], 1 - levels[k])
        code[:, k] = decide(test, lo[:, k], hi[:, k])
    decided = code != INCONCLUSIVE
    stop = np.where(decided.any(axis=1), decided.argmax(axis=1), K - 1) if K else np.zeros(S, dtype=int)
    r = np.arange(S)
    pick = (lambda a: a[r, stop]) if K else (lambda a: np.full(S, np.nan))
    return {"lo": lo, "hi": hi, "code": code, "mean": mean, "stop": stop, "verdict": pick(code).astype(int) if K
            else np.zeros(S, dtype=int), "seeds_used": np.asarray(looks)[stop] if K else np.zeros(S, dtype=int),
            "lo_final": pick(lo), "hi_final": pick(hi), "mean_final": pick(mean)}


def decision_rates(test: dict, sd: float, looks: list[int], levels, studies: int = 20_000, seed: int = 0,
                   theta: float = 0.0) -> np.ndarray:
    """``[K]``: the chance that the sequential rule (:func:`sequential`) has decided by each look, over
    ``studies`` simulated studies whose per-seed paired effects are iid ``N(theta, sd^2)`` (accuracy
    units, as ``test``'s margin). The last entry is the design's power at ``theta``: a study that
    registers ``looks`` for 80% power at a spread ``sd`` needs it >= 0.8. Monte-Carlo error about
    ``sqrt(p (1 - p) / studies)``.

    Raises:
        ValueError: ``sd`` not positive, or ``levels`` not one per look.
    """
    if not sd > 0:
        raise ValueError(f"sd={sd}: expected a positive per-seed spread")
    if len(levels) != len(looks):
        raise ValueError(f"{len(levels)} levels for {len(looks)} looks: expected one per look")
    x = theta + sd * np.random.default_rng(seed).standard_normal((studies, looks[-1]))
    r = sequential(x, test, list(looks), levels)
    decided = r["verdict"] != INCONCLUSIVE
    return np.array([(decided & (r["stop"] <= k)).mean() for k in range(len(looks))])
