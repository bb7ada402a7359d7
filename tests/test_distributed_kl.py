"""The adaptive KL controller under ``torchrun``: 2 ranks move the coefficient exactly as one
process does (the controller sees the step's completions over all ranks, not a rank's share), also
when DAPO's filter leaves the ranks with different numbers of groups, and it never goes negative.

Launches and comparisons are those of ``tests/test_distributed.py`` (float64, to 1e-10).
"""

from __future__ import annotations

import pytest

from tests.test_distributed import EXACT, F64, _history, assert_same, pair, tiny_dir  # noqa: F401  (tiny_dir: the fixture)



def test_two_ranks_equal_one_adaptive_kl_with_dapo(tiny_dir, tmp_path):  # noqa: F811
    # horizon 10 against 16 completions a step: the coefficient moves by up to 32% a step, so a
    # rank-local count (8, or fewer after DAPO's filter) would give another trajectory at once.
    extra = ["beta=0.1", "kl.form=k3", "kl.controller=adaptive", "kl.target=0.05", "kl.horizon=10",
             "group_filter=dapo", "group_filter.max_rounds=3", "overlong.buffer=3", "checkpoint.every=0", F64]
    one, two = pair(tiny_dir, tmp_path, "akl", steps=3, extra=extra)
    a, _ = assert_same(one, two, 3, tiny_dir)
    c1, c2 = _history(one, "train/kl_coef"), _history(two, "train/kl_coef")
    assert sorted(c1) == sorted(c2) == [1, 2, 3]
    for s in c1:
        assert c2[s] == pytest.approx(c1[s], **EXACT), (s, c1, c2)
    coef = [c1[s] for s in sorted(c1)]
    assert coef[0] == pytest.approx(0.1) and len(set(coef)) == 3, f"the controller did not move beta: {coef}"
    assert min(coef) >= 0.0
    assert max(a["train/prompts_sampled"].values()) > 4, "no group was filtered: the case tests nothing"
