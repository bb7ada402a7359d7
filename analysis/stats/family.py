"""Several treatments against one control in one study (``comparisons``), Bonferroni-corrected.

A study file may list ``comparisons: [armA, armB, ...]`` in place of ``treatment``: each arm is
compared with ``control`` (effect = arm - control, paired by seed; the control's runs are shared by
every comparison). Each comparison is decided by the study's rule (the paired t or t-TOST of
:mod:`analysis.stats.paired`, sequential when the study is) at the Bonferroni level ``alpha / m`` for
``m`` comparisons (Bonferroni 1936; Dunn 1961, JASA 56:52). Bonferroni rather than Holm because the
verdict is read off an interval: Bonferroni gives each comparison a simultaneous interval at level
``1 - alpha / m`` (``1 - 2 alpha / m`` for TOST), which Holm's step-down does not, and it splits a
sequential boundary's total alpha the same way. The family-wise rate of a false ``reproduced`` is
then at most ``alpha`` whatever the correlation between comparisons (the shared control correlates
them by 0.5 under equal arm variances); ``tests/test_multiarm.py`` simulates it.

A study without ``comparisons`` is unchanged: this module is only called for one that has them
(the study file's ``comparisons`` block is checked by :func:`analysis.study.spec.load_study`).
"""

from __future__ import annotations

import numpy as np

from analysis.stats.paired import interval_level
from analysis.stats.boundaries import nominal_levels, sequential


def corrected_test(test: dict, m: int) -> dict:
    """The study's ``test`` with ``alpha`` split over ``m`` comparisons (Bonferroni: ``alpha / m``)."""
    return {**test, "alpha": test.get("alpha", 0.05) / m}


def sub_spec(spec: dict, arm: str) -> dict:
    """The two-arm study of one comparison (``arm - control``): same store, seeds, metric and design,
    ``treatment = arm`` and the Bonferroni-corrected test; ``comparison_of`` records the family."""
    m = len(spec["comparisons"])
    out = {k: v for k, v in spec.items() if k != "comparisons"}
    return {**out, "treatment": arm, "test": corrected_test(spec["test"], m),
            "comparison_of": {"comparisons": list(spec["comparisons"]), "m": m,
                              "alpha_family": spec["test"].get("alpha", 0.05), "correction": "bonferroni"}}


def family_verdicts(per_seed, test: dict, looks: list[int], family_levels) -> dict:
    """The corrected rule over simulated multi-comparison studies, vectorised.

    Args:
        per_seed: ``[studies, m, seeds]`` per-seed paired effects (arm - control) of the ``m``
            comparisons, seeds in registration order.
        test: the study's uncorrected ``test``.
        looks: seeds at each look (``[n]`` for the fixed design).
        family_levels: ``[K]`` nominal two-sided alphas of each comparison's interval, already split
            over the ``m`` comparisons (:func:`comparison_levels`).

    Returns:
        ``verdict``, ``seeds_used``: ``[studies, m]`` as :func:`analysis.stats.boundaries.sequential`
        per comparison.
    """
    x = np.asarray(per_seed, dtype=float)
    S, m, n = x.shape
    seq = sequential(x.reshape(S * m, n), test, looks, family_levels)
    return {"verdict": seq["verdict"].reshape(S, m), "seeds_used": seq["seeds_used"].reshape(S, m)}


def comparison_levels(test: dict, m: int, looks: list[int], boundary: str | None = None) -> list[float]:
    """Nominal two-sided alphas of each comparison's interval at each look: the fixed design's
    ``1 - level`` at ``alpha / m`` (one look), or the boundary's levels spending ``(1 - level)`` at
    ``alpha / m`` over ``looks``."""
    t = corrected_test(test, m)
    total = 1 - interval_level(t["kind"], t["alpha"])
    if boundary is None:
        return [total]
    return [float(v) for v in nominal_levels(boundary, looks, total)]
