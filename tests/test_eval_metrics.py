"""Grouped pass@k and maj@k on eval (issue 30): the unbiased maj@k against hand values and against
the vote of every k-subset, and ``evaluate`` logging pass@k / maj@k for the powers of 2 below n."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.algo import maj_at_k, pass_at_k
from harness.train.evaluation import evaluate, sampled_ks
from harness.rollout.base import RolloutBatch
from harness.verifiers.batch import Verdict


def _every_subset(answers, correct, k) -> float:
    """maj@k by brute force: the tie-split vote of each of the C(n, k) subsets, averaged."""
    right = {a for a, ok in zip(answers, correct) if ok and a is not None}
    total, subsets = Fraction(0), 0
    for sub in itertools.combinations(range(len(answers)), k):
        subsets += 1
        votes: dict = {}
        for i in sub:
            if answers[i] is not None:
                votes[answers[i]] = votes.get(answers[i], 0) + 1
        if votes:
            top = max(votes.values())
            tied = [a for a, v in votes.items() if v == top]
            total += Fraction(sum(a in right for a in tied), len(tied))
    return float(total / subsets)


def test_maj_at_k_hand_values():
    # k = n: the plain majority vote of all samples
    assert maj_at_k(["8", "8", "7"], [True, True, False], 3) == 1.0
    assert maj_at_k(["7", "7", "8"], [False, False, True], 3) == 0.0
    assert maj_at_k(["8", "7"], [True, False], 2) == 0.5  # a tie of 2: half the credit
    # n = 3, k = 2: {8,8} wins; {8,7} twice is a tie -> (1 + 1/2 + 1/2) / 3
    assert maj_at_k(["8", "8", "7"], [True, True, False], 2) == pytest.approx(2 / 3)
    # k = 1: the fraction of samples correct (mean@n); abstainers (None) count as wrong
    assert maj_at_k(["8", None, "7", "8"], [True, False, False, True], 1) == pytest.approx(0.5)
    # abstainers do not vote: {8, None} -> 8 wins; {None, None} -> nobody answered, 0
    assert maj_at_k(["8", None, None], [True, False, False], 2) == pytest.approx(2 / 3)
    # two wrong answers that outnumber the right one only together: the vote still picks 8 at k = n
    assert maj_at_k(["8", "8", "1", "2"], [True, True, False, False], 4) == 1.0


def test_maj_at_k_differs_from_pass_at_k_and_mean():
    """The vote can lose where pass@k wins: one right answer among repeated wrong ones."""
    answers, correct = ["8", "7", "7", "7"], [True, False, False, False]
    assert pass_at_k(4, 1, 4) == 1.0 and maj_at_k(answers, correct, 4) == 0.0
    assert maj_at_k(answers, correct, 1) == 0.25


def test_maj_at_k_rejects_bad_input():
    with pytest.raises(ValueError, match="differ in length"):
        maj_at_k(["1", "2"], [True], 1)
    for k in (0, 3, True, 1.0):
        with pytest.raises(ValueError, match="k must be an int"):
            maj_at_k(["1", "2"], [True, False], k)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["1", "2", "3", None]), min_size=1, max_size=8), st.data())
def test_maj_at_k_is_the_vote_of_every_k_subset(answers, data):
    correct = [a == "1" for a in answers]
    k = data.draw(st.integers(1, len(answers)))
    assert maj_at_k(answers, correct, k) == pytest.approx(_every_subset(answers, correct, k), abs=1e-12)


def test_sampled_ks():
    assert sampled_ks(1) == [1] and sampled_ks(2) == [2]
    assert sampled_ks(6) == [2, 4, 6] and sampled_ks(8) == [2, 4, 8]


# ----------------------------------------------------------------------------- through evaluate()
@dataclass
class _Problem:
    id: str
    question: str
    gold: str


class _Task:
    """The completion text is the answer; "8" is right for problem a, "5" for problem b."""

    def prompt(self, problem, tokenizer):
        return problem.question

    def score(self, texts, golds):
        return [Verdict(correct=t == g, formatted=t != "", extracted=t or None, status="ok") for t, g in zip(texts, golds)]


class _Backend:
    """Greedy: "8" for every prompt; sampled: the fixed answers of each prompt."""

    SAMPLED = {"a": ["8", "7", "7", "8"], "b": ["", "5", "3", "3"]}

    def generate(self, prompts, num_samples, params):
        if params.temperature == 0:
            texts = ["8" for _ in prompts]
        else:
            texts = [t for p in prompts for t in self.SAMPLED[p][:num_samples]]
        rows = len(texts)
        one = torch.ones(rows, 1, dtype=torch.long)
        return RolloutBatch(one, one, one, one, torch.zeros(rows, dtype=torch.bool), texts, num_samples)


def test_evaluate_logs_grouped_pass_and_maj_at_k():
    problems = [_Problem("a", "a", "8"), _Problem("b", "b", "5")]
    m, _ = evaluate(_Task(), _Backend(), None, problems, max_new_tokens=4, num_samples=4, batch_size=8)
    # hand values, problem by problem (a: 8 right twice of 4, vs 7 twice; b: one 5, two 3s, one empty)
    a, b = (["8", "7", "7", "8"], [1, 0, 0, 1]), ([None, "5", "3", "3"], [0, 1, 0, 0])
    assert m["eval/mean_at_k"] == pytest.approx(3 / 8)
    assert m["eval/pass_at_2"] == pytest.approx((pass_at_k(4, 2, 2) + pass_at_k(4, 1, 2)) / 2)
    assert m["eval/pass_at_4"] == m["eval/pass_at_k"] == 1.0
    assert m["eval/maj_at_4"] == m["eval/maj_at_k"] == pytest.approx((0.5 + 0.0) / 2)  # a: tie 8/7; b: 3 wins
    assert m["eval/maj_at_2"] == pytest.approx((_every_subset(*a, 2) + _every_subset(*b, 2)) / 2)
    assert m["eval/maj_at_2"] != m["eval/pass_at_2"] and m["eval/num_samples"] == 4
    assert m["eval/accuracy"] == 0.5  # greedy "8": right on a only
