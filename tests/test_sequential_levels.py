"""The sequential boundaries hold their level for the statistic that decides, the paired t with
seeds - 1 df, at 3-12 seeds: null simulations of 200,000-400,000 studies a case through
:func:`analysis.stats.sequential` (and :func:`analysis.stats.family_verdicts` for the grid's
7-comparison family), drawn with seeds independent of the boundaries' own (``analysis.stats.T_SEED``).

Each boundary's rate of a false verdict (either tail: the total it spends) must lie within 2
Monte-Carlo errors of its nominal rate, and each tail (false "reproduced", false "contradicted")
within :data:`TAIL_ERRORS`. The error counts both simulations: this one's binomial error and the
boundary's own, from the ``analysis.stats.T_STUDIES`` null studies it was derived from. The z levels of
the same spending (:func:`analysis.stats.z_nominal_levels`), applied to the same draws, must fail
the check, so the check can see the defect they have. Printed figures: docs/studies.md.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import stats as st
from analysis.stats import boundaries

pytestmark = pytest.mark.slow

ALPHA = 0.05
DESIGNS = [(4, 2, 12), (3, 2, 12)]  # looks 4-6-8-10-12 and 3-5-7-9-11-12
# the two-sided totals as the studies compute them (analysis.study.design_looks, st.comparison_levels)
DIFF_TOTAL = 1 - st.interval_level("difference", ALPHA)
TOST_TOTAL = 1 - st.interval_level("equivalence", ALPHA)
# 14 tails are checked: at 2 errors each the file would fail by chance about half the time with
# exact boundaries; at 3, about 4% of the time (Bonferroni: z_{1 - 0.05 / 28} = 2.9)
TAIL_ERRORS = 3
SEEDS = {"difference": 5701, "tost": 5702, "tost_wide": 5703, "family": 5704}  # none is st.T_SEED


def _error(p: float, n: int, se: float | None = None) -> float:
    """One Monte-Carlo error of a rate with nominal value ``p``: this simulation's (binomial over
    ``n`` studies, or ``se`` when given) and the boundary derivation's, together."""
    own = se if se is not None else math.sqrt(p * (1 - p) / n)
    return math.sqrt(own ** 2 + p * (1 - p) / st.T_STUDIES)


def _rates(verdicts) -> tuple[float, float]:
    return float((verdicts == st.REPRODUCED).mean()), float((verdicts == st.CONTRADICTED).mean())


def _check(capsys, label: str, tail: float, n: int, t_rates, z_rates, se=None) -> None:
    """Print and check one case: ``t_rates`` / ``z_rates`` = (false "reproduced", false
    "contradicted") at the t and z levels, each tail's nominal rate ``tail``; ``se``: this
    simulation's own errors of (tail, tail, total) when not binomial over ``n`` studies."""
    se = se or (None, None, None)
    errs = [_error(tail, n, se[0]), _error(tail, n, se[1]), _error(2 * tail, n, se[2])]
    t_rates, z_rates = [*t_rates, sum(t_rates)], [*z_rates, sum(z_rates)]
    nominal = [tail, tail, 2 * tail]
    with capsys.disabled():
        print(f"\n{label}, false reproduced / contradicted / either "
              f"(nominal {tail:.5f} / {tail:.5f} / {2 * tail:.5f}): "
              + "; ".join(f"{name} levels " + " / ".join(f"{r:.5f} ({(r - p) / e:+.1f} err)" for r, p, e
                                                           in zip(rates, nominal, errs))
                          for name, rates in (("t", t_rates), ("z", z_rates))))
    assert abs(t_rates[2] - 2 * tail) <= 2 * errs[2], t_rates
    assert all(abs(r - tail) <= TAIL_ERRORS * e for r, e in zip(t_rates[:2], errs)), t_rates
    assert z_rates[2] > 2 * tail + 2 * errs[2], z_rates


def _looks_levels(boundary: str, design, total: float):
    looks = st.look_sizes(*design)
    return looks, st.nominal_levels(boundary, looks, total), st.z_nominal_levels(boundary, looks, total)


@pytest.mark.parametrize("design", DESIGNS)
@pytest.mark.parametrize("boundary", ["obrien_fleming", "pocock"])
def test_difference_test_false_verdicts_at_alpha_over_2(design, boundary, capsys):
    """True difference 0, per-seed sd 6 points: false "reproduced" (predicted sign +) and false
    "contradicted" each at alpha / 2 = 0.025."""
    n = 400_000
    looks, lt, lz = _looks_levels(boundary, design, DIFF_TOTAL)
    rng = np.random.default_rng(SEEDS["difference"] + 10 * looks[0] + (boundary == "pocock"))
    x = 0.06 * rng.standard_normal((n, looks[-1]))
    test = {"kind": "difference", "sign": 1, "alpha": ALPHA}
    t_rates, z_rates = (_rates(st.sequential(x, test, looks, lv)["verdict"]) for lv in (lt, lz))
    _check(capsys, f"difference, {boundary}, looks {looks}", ALPHA / 2, n, t_rates, z_rates)


@pytest.mark.parametrize("design", DESIGNS)
def test_tost_at_the_margin_each_tail_at_alpha(design, capsys):
    """True effect on the margin (+5 points), per-seed sd 0.1 points, so the interval never reaches
    the other margin and TOST is the two-sided crossing of T = (mean - margin) / se: false
    "reproduced" (below) and "contradicted" (above) each at alpha, with the boundaries at 2 alpha."""
    n = 400_000
    looks, lt, lz = _looks_levels("obrien_fleming", design, TOST_TOTAL)
    rng = np.random.default_rng(SEEDS["tost"] + looks[0])
    x = 0.05 + 0.001 * rng.standard_normal((n, looks[-1]))
    test = {"kind": "equivalence", "margin": 0.05, "alpha": ALPHA}
    t_rates, z_rates = (_rates(st.sequential(x, test, looks, lv)["verdict"]) for lv in (lt, lz))
    _check(capsys, f"TOST at +margin, looks {looks}", ALPHA, n, t_rates, z_rates)


def test_tost_at_the_margin_with_a_wide_spread_stays_below_alpha(capsys):
    """The grid's spread (per-seed sd 6 points against the 5-point margin): an interval that also
    reaches the lower margin is not "reproduced", so the false "reproduced" rate is at most alpha."""
    n = 400_000
    looks, lt, lz = _looks_levels("obrien_fleming", (4, 2, 12), TOST_TOTAL)
    x = 0.05 + 0.06 * np.random.default_rng(SEEDS["tost_wide"]).standard_normal((n, looks[-1]))
    test = {"kind": "equivalence", "margin": 0.05, "alpha": ALPHA}
    t_rates, z_rates = (_rates(st.sequential(x, test, looks, lv)["verdict"]) for lv in (lt, lz))
    err = _error(ALPHA, n)
    with capsys.disabled():
        print(f"\nTOST at +margin, sd 6 points, looks {looks}, false reproduced / contradicted (nominal at most "
              f"{ALPHA}): t levels {t_rates[0]:.5f} / {t_rates[1]:.5f}; z levels {z_rates[0]:.5f} / {z_rates[1]:.5f}")
    assert t_rates[0] <= ALPHA + 2 * err and t_rates[1] <= ALPHA + 2 * err, t_rates


@pytest.mark.parametrize("design", DESIGNS)
def test_one_comparison_of_the_grid_family_at_alpha_over_7(design, capsys):
    """The design card grid's family: 7 arms against one shared control (the control's seeds drawn
    once per study, so the comparisons correlate by 0.5), TOST within 5 points at 0.05 / 7, every
    arm on the +margin, per-seed sd 0.02 points an arm. Each comparison's false "reproduced" and
    false "contradicted" at 0.05 / 7 each (rates averaged over the 7 comparisons, errors from the
    per-study means, which carry the correlation); the family-wise rate of any false "reproduced"
    at most 0.05."""
    n, m = 200_000, 7
    test = {"kind": "equivalence", "margin": 0.05, "alpha": ALPHA}
    looks = st.look_sizes(*design)
    lt = st.comparison_levels(test, m, looks, "obrien_fleming")
    t_total = 1 - st.interval_level("equivalence", ALPHA / m)
    lz = st.z_nominal_levels("obrien_fleming", looks, t_total)
    rng = np.random.default_rng(SEEDS["family"] + looks[0])
    arms = 0.0002 * rng.standard_normal((n, m + 1, looks[-1]))
    arms[:, 1:] += 0.05  # every arm on the margin; arms[:, 0] is the control
    x = arms[:, 1:] - arms[:, :1]
    del arms
    out = []
    for lv in (lt, lz):
        v = st.family_verdicts(x, test, looks, lv)["verdict"]  # [studies, m]
        per_study = [(v == code).mean(axis=1) for code in (st.REPRODUCED, st.CONTRADICTED)]
        per_study.append(per_study[0] + per_study[1])
        out.append(([float(p.mean()) for p in per_study], [float(p.std(ddof=1) / math.sqrt(n)) for p in per_study],
                    float((v == st.REPRODUCED).any(axis=1).mean())))
    (t_rates, t_se, t_fwer), (z_rates, _, _) = out
    _check(capsys, f"grid family, one comparison, looks {looks} (family-wise false reproduced {t_fwer:.5f})",
           ALPHA / m, n, t_rates[:2], z_rates[:2], se=t_se)
    assert t_fwer <= ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / n)


def test_the_committed_table_is_the_derivation():
    """analysis/stats/t_boundaries.json holds what :func:`analysis.stats.derive_t_levels` computes
    (the same studies, seed and, when numpy's version is the table's, the same numbers)."""
    table = boundaries._t_table()
    assert (table["studies"], table["seed"]) == (st.T_STUDIES, st.T_SEED)
    key = st.design_key("obrien_fleming", (3, 5, 7, 9), 0.05)
    fresh = st.derive_t_levels("obrien_fleming", (3, 5, 7, 9), 0.05)
    if table["numpy"] == np.__version__:
        assert list(fresh) == table["designs"][key]
    else:  # another normal stream: the same boundary up to its Monte-Carlo error (about 1% of a level)
        assert fresh == pytest.approx(table["designs"][key], rel=0.03)
