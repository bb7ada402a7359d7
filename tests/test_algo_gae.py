"""GAE, REINFORCE++ returns and the token-level estimators built on them (hand-computed)."""

import math

import pytest
import torch

from harness.algo import AdvantageContext, estimate_advantages, gae
from harness.algo.gae import reinforce_pp_returns


def close(a, b, atol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32),
                          torch.as_tensor(b, dtype=torch.float32), atol=atol)


def _mask(lengths, T):
    return (torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()


def _whiten(xs):
    """Plain-python whitening with unbiased variance (reference for the tests)."""
    mu = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mu) ** 2 for x in xs) / (len(xs) - 1))
    return [(x - mu) / std for x in xs]


# ----------------------------------------------------------------- GAE


def test_gae_hand_unrolled_with_masked_token():
    # gamma .9, lam .8, three valid tokens, a 4th masked token with garbage values
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # delta2 = 1 + .9*0 - .7 = .3                 A2 = .3
    # delta1 = 0 + .9*.7 - .6 = .03               A1 = .03 + .72*.3 = .246
    # delta0 = 0 + .9*.6 - .5 = .04               A0 = .04 + .72*.246 = .21712
    assert close(adv, [[0.21712, 0.246, 0.3, 0.0]])
    assert close(ret, [[0.71712, 0.846, 1.0, 0.0]])


def test_gae_batch_rows_independent_and_monte_carlo_limit():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.1, 0.2, 3.0, 3.0]])
    mask = _mask([3, 2], 4)
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    assert close(adv[0], [0.21712, 0.246, 0.3, 0.0])
    # row 1: delta1 = 2 - .2 = 1.8; delta0 = .5 + .9*.2 - .1 = .58; A0 = .58 + .72*1.8
    assert close(adv[1], [0.58 + 0.72 * 1.8, 1.8, 0.0, 0.0])
    # gamma = lam = 1: A_t = sum_{s>=t} r_s - V_t
    adv1, ret1 = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert close(adv1[0], [1.0 - 0.5, 1.0 - 0.6, 1.0 - 0.7, 0.0])
    assert close(ret1[1], [2.5, 2.0, 0.0, 0.0])


def test_gae_errors():
    z = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="right-padded"):
        gae(z, z, torch.tensor([[1.0, 0.0, 1.0]]), gamma=1.0, lam=1.0)
    with pytest.raises(ValueError, match="gamma"):
        gae(z, z, torch.ones(1, 3), gamma=1.5, lam=1.0)
    with pytest.raises(ValueError, match="lam"):
        gae(z, z, torch.ones(1, 3), gamma=1.0, lam=-0.1)
    with pytest.raises(ValueError, match="values"):
        gae(z, torch.zeros(1, 2), torch.ones(1, 3), gamma=1.0, lam=1.0)


# ----------------------------------------------------------------- REINFORCE++

TOKEN_REWARDS = torch.tensor([[0.0, -0.2, 1.0], [-0.4, 0.0, 0.0]])
MASK = _mask([3, 2], 3)


def test_reinforce_pp_returns_hand():
    # gamma .5: row0 G2 = 1, G1 = -.2 + .5 = .3, G0 = 0 + .15 = .15; row1 G1 = 0, G0 = -.4
    ret = reinforce_pp_returns(TOKEN_REWARDS, MASK, gamma=0.5)
    assert close(ret, [[0.15, 0.3, 1.0], [-0.4, 0.0, 0.0]])


def test_reinforce_pp_estimator_hand():
    ctx = AdvantageContext(scores=torch.tensor([[0.8, -0.4]]), token_rewards=TOKEN_REWARDS,
                           mask=MASK)
    out = estimate_advantages("reinforce_pp", ctx, gamma=0.5)
    # returns [.15, .3, 1.0 | -.4, 0.0] whitened over the 5 valid tokens
    w = _whiten([0.15, 0.3, 1.0, -0.4, 0.0])
    assert close(out.advantages, [[w[0], w[1], w[2]], [w[3], w[4], 0.0]])
    assert close(w[:3], [-0.116997, 0.175495, 1.540457])  # mean .21, std .512835


def test_population_variance_whitening_by_hand():
    """unbiased=False whitens with the population variance (OpenRLHF masked_normalize)."""
    ctx = AdvantageContext(scores=torch.tensor([[0.8, -0.4]]), token_rewards=TOKEN_REWARDS, mask=MASK)
    x = [0.15, 0.3, 1.0, -0.4, 0.0]  # gamma 0.5 returns, as above; mean .21
    var_pop = sum((v - 0.21) ** 2 for v in x) / 5  # 0.2104 (the unbiased one is 0.263)
    want = [(v - 0.21) / math.sqrt(var_pop + 1e-8) for v in x]
    for name in ("reinforce_pp", "ppo"):
        kw = {"gamma": 0.5} if name == "reinforce_pp" else {"gamma": 0.5, "lam": 1.0}
        c = ctx if name == "reinforce_pp" else AdvantageContext(ctx.scores, TOKEN_REWARDS, MASK,
                                                                values=torch.zeros_like(TOKEN_REWARDS))
        pop = estimate_advantages(name, c, unbiased=False, **kw).advantages
        assert close(pop, [[want[0], want[1], want[2]], [want[3], want[4], 0.0]]), name
        unb = estimate_advantages(name, c, **kw).advantages
        assert close(unb[0, :1], [want[0] * math.sqrt(4 / 5)]), name  # ratio sqrt((n-1)/n)


def test_reinforce_pp_baseline_hand():
    ctx = AdvantageContext(scores=torch.tensor([[0.8, -0.4]]), token_rewards=TOKEN_REWARDS,
                           mask=MASK)
    out = estimate_advantages("reinforce_pp_baseline", ctx)  # gamma 1
    # group mean of scores .2 subtracted at last tokens: [0,-.2,.8] and [-.4,-.2]
    # return-to-go: [.6,.6,.8] and [-.6,-.2]
    w = _whiten([0.6, 0.6, 0.8, -0.6, -0.2])
    assert close(out.advantages, [[w[0], w[1], w[2]], [w[3], w[4], 0.0]])


def test_reinforce_pp_baseline_requires_groups():
    ctx = AdvantageContext(scores=torch.tensor([[0.8], [-0.4]]), token_rewards=TOKEN_REWARDS,
                           mask=MASK)
    with pytest.raises(ValueError, match="group_size"):
        estimate_advantages("reinforce_pp_baseline", ctx)
    estimate_advantages("reinforce_pp", ctx)  # fine without groups


# ----------------------------------------------------------------- PPO


def test_ppo_estimator():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 5.0], [0.5, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 9.0], [0.1, 0.2, 3.0, 3.0]])
    mask = _mask([3, 2], 4)
    ctx = AdvantageContext(scores=torch.tensor([[1.0, 2.5]]), token_rewards=rewards,
                           mask=mask, values=values)
    raw = estimate_advantages("ppo", ctx, gamma=0.9, lam=0.8, whiten=False)
    a = [0.21712, 0.246, 0.3, 0.58 + 0.72 * 1.8, 1.8]
    assert close(raw.advantages, [[a[0], a[1], a[2], 0.0], [a[3], a[4], 0.0, 0.0]])
    assert close(raw.returns, [[0.71712, 0.846, 1.0, 0.0], [a[3] + 0.1, 2.0, 0.0, 0.0]])
    white = estimate_advantages("ppo", ctx, gamma=0.9, lam=0.8)
    w = _whiten(a)
    assert close(white.advantages, [[w[0], w[1], w[2], 0.0], [w[3], w[4], 0.0, 0.0]])
    assert torch.equal(white.returns, raw.returns)  # returns from un-whitened advantages
    with pytest.raises(ValueError, match="values"):
        estimate_advantages("ppo", AdvantageContext(ctx.scores, rewards, mask))


# ----------------------------------------------------------------- process supervision


def _process_ctx(steps):
    return AdvantageContext(scores=torch.zeros(1, 2), token_rewards=torch.zeros(2, 4),
                            mask=_mask([4, 3], 4), step_rewards=steps)


def test_process_two_step_example():
    # group steps: row0 (end 1, r=1), (end 3, r=0); row1 (end 2, r=0)
    # mean 1/3, unbiased std sqrt(1/3): normalised [2/sqrt3, -1/sqrt3, -1/sqrt3]
    steps = [[(1, 1.0), (3, 0.0)], [(2, 0.0)]]
    out = estimate_advantages("process", _process_ctx(steps))
    s = 1 / math.sqrt(3)
    # row0 t0,t1: 2s - s = s ; t2,t3: -s.  row1 t0..t2: -s, t3 masked
    assert close(out.advantages, [[s, s, -s, -s], [-s, -s, -s, 0.0]])
    # population std sqrt(2/9): normalised [sqrt2, -1/sqrt2, -1/sqrt2]
    pop = estimate_advantages("process", _process_ctx(steps), unbiased=False)
    h = 1 / math.sqrt(2)
    assert close(pop.advantages, [[h, h, -h, -h], [-h, -h, -h, 0.0]])


def test_process_rows_without_steps_and_degenerate_groups():
    out = estimate_advantages("process", _process_ctx([[(1, 1.0), (3, 0.0)], []]))
    # steps [1, 0]: mean .5, unbiased std sqrt(.5): normalised [1/sqrt2, -1/sqrt2]
    h = 1 / math.sqrt(2)
    assert close(out.advantages, [[0.0, 0.0, -h, -h], [0.0, 0.0, 0.0, 0.0]])
    same = estimate_advantages("process", _process_ctx([[(1, 0.5)], [(2, 0.5)]]))
    assert torch.equal(same.advantages, torch.zeros(2, 4))
    none = estimate_advantages("process", _process_ctx([[], []]))
    assert torch.equal(none.advantages, torch.zeros(2, 4))


def test_process_errors():
    with pytest.raises(ValueError, match="step_rewards"):
        estimate_advantages("process", _process_ctx(None))
    with pytest.raises(ValueError, match="end index"):
        estimate_advantages("process", _process_ctx([[(1, 1.0)], [(3, 0.0)]]))  # row1 has 3 tokens
    with pytest.raises(ValueError, match="step_rewards"):
        estimate_advantages("process", _process_ctx([[(1, 1.0)]]))
