"""reward=random: a Bernoulli(p) outcome reward that ignores the answer (the negative control of
studies/random_reward.yaml), seeded per (seed, data position of the step's draw, row)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from harness.train.rewards import (OUTCOME_REWARDS, RandomRewardParams, RewardKey, compute_rewards, outcome_reward,
                             random_reward)
from harness.verifiers.batch import Verdict
from tests.conftest import compose

P = RandomRewardParams()


def _draw(n: int, seed=0, position=0, first_row=0, stream=0, p=P) -> list[float]:
    return random_reward(torch.zeros(n), RewardKey(seed, position, first_row, stream), p).tolist()


def test_the_same_key_gives_the_same_draw_whatever_the_batch_split():
    """Rows 8-15 drawn as a batch of their own (a second rank's share, ``first_row=8``) are rows 8-15
    of the whole draw; a second call gives the same values."""
    whole = _draw(16, seed=3, position=12)
    assert whole == _draw(16, seed=3, position=12)
    assert _draw(8, seed=3, position=12, first_row=8) == whole[8:]
    assert set(whole) <= {0.0, 1.0}


def test_rows_steps_seeds_and_streams_draw_independently():
    """64 rows are not all equal, and changing the seed, the position (the step) or the stream
    changes about half of the 4,000 draws (independent fair coins agree with probability 1/2)."""
    n = 4000
    base = _draw(n, seed=1, position=8)
    assert 0 < sum(base[:64]) < 64
    for other in (_draw(n, seed=2, position=8), _draw(n, seed=1, position=12), _draw(n, seed=1, position=8, stream=1)):
        agree = sum(a == b for a, b in zip(base, other)) / n
        assert abs(agree - 0.5) <= 3 * math.sqrt(0.25 / n), agree


@pytest.mark.parametrize("p", [0.5, 0.2])
def test_the_mean_is_p_over_many_rows(p):
    n = 20_000
    mean = sum(_draw(n, seed=5, position=4, p=RandomRewardParams(p=p))) / n
    assert mean == pytest.approx(p, abs=3 * math.sqrt(p * (1 - p) / n))


def test_the_verifiers_answer_has_no_effect():
    """Through compute_rewards: a task whose verifier accepts every answer and one that accepts none
    give the same outcome and total rewards (no format weight); only ``correct`` differs."""
    def task(ok):
        return SimpleNamespace(score=lambda texts, golds: [Verdict(ok, ok, "1" if ok else None, "ok") for _ in texts])

    fn = outcome_reward(compose("reward=random").reward)
    key = RewardKey(7, 40, first_row=0)
    outs = [compute_rewards(task(ok), ["a"] * 32, ["1"] * 32, torch.full((32,), 5), format_weight=0.0,
                            max_new_tokens=48, outcome=fn, key=key) for ok in (True, False)]
    assert outs[0].correct.tolist() == [1.0] * 32 and outs[1].correct.tolist() == [0.0] * 32
    assert outs[0].outcome.tolist() == outs[1].outcome.tolist() == _draw(32, seed=7, position=40)
    assert outs[0].rewards.tolist() == outs[1].rewards.tolist() == outs[0].outcome.tolist()
    assert random_reward(torch.ones(32), key, P).tolist() == random_reward(torch.zeros(32), key, P).tolist()


def test_the_verifier_reward_is_the_default_and_bad_values_are_refused():
    cfg = compose()
    assert cfg.reward.name == "verifier" and OUTCOME_REWARDS.names() == ["random", "verifier"]
    assert compose("reward=random").reward.p == 0.5 and compose("reward=random", "reward.p=0.3").reward.p == 0.3
    correct = torch.tensor([1.0, 0.0, 1.0])
    assert outcome_reward(cfg.reward)(correct, RewardKey(0, 0)) is correct
    with pytest.raises(ValueError, match=r"reward.p must be in \[0, 1\], got 1.5"):
        _draw(4, p=RandomRewardParams(p=1.5))
    with pytest.raises(ValueError, match="reward=random needs a seed, data position and row >= 0"):
        _draw(4, seed=-1)


@pytest.mark.slow
def test_a_run_trains_on_the_draws_of_its_seed_step_and_row():
    """The trainer's rewards under reward=random (tiny model, the knob probe's run) are the draws of
    (seed, step x prompts_per_step, row) of every step, whatever the verifier said; train/accuracy
    still reports the verifier's verdicts."""
    from tests.knob_probe import BASE, probe

    cfg = compose(*BASE, "reward=random")
    obs = probe("reward=random")
    B = cfg.train.prompts_per_step * cfg.group_size
    assert len(obs["rewards"]) == cfg.train.steps
    for step, rewards in enumerate(obs["rewards"]):
        assert rewards.tolist() == _draw(B, seed=cfg.seed, position=step * cfg.train.prompts_per_step)
    verifier = probe()  # step 1 samples the same completions (no update yet): the verifier's verdicts on them
    assert all(torch.equal(a, b) for a, b in zip(obs["rollout"][0], verifier["rollout"][0]))
    assert obs["metrics"][1]["train/accuracy"] == verifier["metrics"][1]["train/accuracy"]
    assert obs["rewards"][0].tolist() != verifier["rewards"][0].tolist()
