"""Outcome / token advantage estimators, utils and registry (hand-computed values)."""

import math

import pytest
import torch

from harness.algo import (
    TOKEN_ESTIMATORS,
    AdvantageContext,
    compute_advantages,
    estimate_advantages,
    masked_mean,
    masked_whiten,
    outcome_names,
    pass_at_k,
    requires_groups,
)
from harness.registry import Registry
from harness.algo.utils import explained_variance, masked_var

ONE_HOT = torch.tensor([[1.0, 0.0, 0.0, 0.0]])


def close(a, b, atol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32),
                          torch.as_tensor(b, dtype=torch.float32), atol=atol)


# ----------------------------------------------------------------- outcome estimators


def test_grpo_one_hot_group():
    # mean .25, unbiased std = sqrt((.75^2 + 3*.25^2)/3) = sqrt(.25) = .5
    assert close(compute_advantages(ONE_HOT, "grpo"), [[1.5, -0.5, -0.5, -0.5]])


def test_grpo_population_std():
    # population std = sqrt(3/16) -> .75/.4330 = sqrt(3), -.25/.4330 = -1/sqrt(3)
    s3 = math.sqrt(3.0)
    out = compute_advantages(ONE_HOT, "grpo", unbiased=False)
    assert close(out, [[s3, -1 / s3, -1 / s3, -1 / s3]])


def test_mean_only_and_rloo_one_hot():
    assert close(compute_advantages(ONE_HOT, "mean_only"), [[0.75, -0.25, -0.25, -0.25]])
    assert close(compute_advantages(ONE_HOT, "rloo"), [[1.0, -1 / 3, -1 / 3, -1 / 3]])


def test_grpo_batch_scale_and_none():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # batch: 3 ones / 5 zeros, mean 3/8, unbiased var = (3*(5/8)^2 + 5*(3/8)^2)/7 = 120/448
    std = math.sqrt(120 / 448)
    expected = [[0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std],
                [0.5 / std, 0.5 / std, -0.5 / std, -0.5 / std]]
    assert close(compute_advantages(r, "grpo", scale="batch"), expected)
    assert torch.equal(compute_advantages(r, "grpo", scale="none"),
                       compute_advantages(r, "mean_only"))


@pytest.mark.parametrize("name", ["grpo", "mean_only", "rloo"])
def test_zero_variance_group_is_exactly_zero(name):
    # 0.1 * 3 / 3 != 0.1 in floating point: the naive r - mean is not exactly 0
    r = torch.tensor([[0.1, 0.1, 0.1], [1.0, 0.0, 1.0]])
    out = compute_advantages(r, name, **({"eps": 0.0} if name == "grpo" else {}))
    assert torch.equal(out[0], torch.zeros(3))
    assert torch.isfinite(out).all()
    assert out[1].abs().sum() > 0


def test_invalid_completion_excluded_from_stats():
    r = torch.tensor([[1.0, 0.0, 0.0, 5.0]])
    valid = torch.tensor([[True, True, True, False]])
    # valid [1,0,0]: mean 1/3, unbiased var = (4/9 + 1/9 + 1/9)/2 = 1/3
    std = math.sqrt(1 / 3)
    assert close(compute_advantages(r, "grpo", valid=valid),
                 [[(2 / 3) / std, (-1 / 3) / std, (-1 / 3) / std, 0.0]])
    assert close(compute_advantages(r, "mean_only", valid=valid), [[2 / 3, -1 / 3, -1 / 3, 0.0]])
    # rloo: 1 - mean(0,0) = 1 ; 0 - mean(1,0) = -.5
    assert close(compute_advantages(r, "rloo", valid=valid), [[1.0, -0.5, -0.5, 0.0]])


def test_nan_reward_of_invalid_completion_does_not_leak():
    r = torch.tensor([[1.0, 0.0, float("nan")]])
    valid = torch.tensor([[True, True, False]])
    out = compute_advantages(r, "rloo", valid=valid)
    assert close(out, [[1.0, -1.0, 0.0]])


@pytest.mark.parametrize("name", ["grpo", "mean_only", "rloo"])
def test_group_with_one_valid_member_gets_zero(name):
    r = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    valid = torch.tensor([[True, False], [True, True]])
    out = compute_advantages(r, name, valid=valid)
    assert torch.equal(out[0], torch.zeros(2))


@pytest.mark.parametrize("name", ["grpo", "mean_only", "rloo"])
def test_group_size_one_raises(name):
    with pytest.raises(ValueError, match=f"group_size must be >= 2 for estimator '{name}'"):
        compute_advantages(torch.ones(3, 1), name)


def test_reinforce_baselines():
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert torch.equal(compute_advantages(r, "reinforce", baseline="none"), r)
    # the default is the batch-mean baseline (one declaration: ReinforceParams)
    assert close(compute_advantages(r, "reinforce"), [[0.25, -0.75], [0.25, 0.25]])
    assert close(compute_advantages(r, "reinforce", baseline="batch_mean"),
                 [[0.25, -0.75], [0.25, 0.25]])
    # works with G = 1
    assert close(compute_advantages(torch.tensor([[2.0], [0.0]]), "reinforce",
                                    baseline="batch_mean"), [[1.0], [-1.0]])


def test_reinforce_ema_state_update():
    state = {}
    r1 = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # mean .75; first call: baseline = batch mean
    a1 = compute_advantages(r1, "reinforce", baseline="ema", ema_decay=0.9, state=state)
    assert close(a1, [[0.25, -0.75], [0.25, 0.25]])
    assert state["ema"] == pytest.approx(0.75)
    a2 = compute_advantages(torch.zeros(2, 2), "reinforce", baseline="ema", ema_decay=0.9,
                            state=state)  # baseline used = .75 (before update)
    assert close(a2, torch.full((2, 2), -0.75))
    assert state["ema"] == pytest.approx(0.9 * 0.75 + 0.1 * 0.0)
    a3 = compute_advantages(torch.ones(2, 2), "reinforce", baseline="ema", ema_decay=0.9,
                            state=state)
    assert close(a3, torch.full((2, 2), 1.0 - 0.675))
    assert state["ema"] == pytest.approx(0.9 * 0.675 + 0.1 * 1.0)


def test_reinforce_ema_requires_state_and_valid_baseline_name():
    with pytest.raises(ValueError, match="state"):
        compute_advantages(torch.ones(2, 2), "reinforce", baseline="ema")
    with pytest.raises(ValueError, match="batch_mean"):
        compute_advantages(torch.ones(2, 2), "reinforce", baseline="median")


def test_unknown_estimator_and_param_raise():
    with pytest.raises(ValueError) as e:
        compute_advantages(ONE_HOT, "gpro")
    for name in ("grpo", "mean_only", "rloo", "reinforce"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="epsilon.*accepted: \\['eps', 'scale', 'unbiased'\\]"):
        compute_advantages(ONE_HOT, "grpo", epsilon=0.1)
    with pytest.raises(ValueError, match="scale"):
        compute_advantages(ONE_HOT, "grpo", scale="global")
    with pytest.raises(ValueError, match="rewards"):
        compute_advantages(torch.ones(4), "grpo")
    with pytest.raises(ValueError, match="valid"):
        compute_advantages(ONE_HOT, "grpo", valid=torch.ones(1, 3, dtype=torch.bool))


def test_max_rl_divides_the_centred_reward_by_the_group_mean():
    """MaxRL (prime-rl max_rl): (r - mean) / mean; a group with mean <= 0 gets 0 (float64, by hand)."""
    f64 = dict(dtype=torch.float64)
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0],  # mean 1/4: (1 - 1/4) / (1/4) = 3, (0 - 1/4) / (1/4) = -1
                      [2.0, 1.0, 0.0, 1.0],  # mean 1: [1, 0, -1, 0]
                      [0.0, 0.0, 0.0, 0.0],  # no success: 0 (prime-rl: no signal)
                      [1.0, 1.0, 1.0, 1.0],  # all success: centred to 0
                      [-1.0, 0.5, 0.0, 0.0]], **f64)  # mean -1/8 <= 0: 0, where r - mean is not
    want = [[3.0, -1.0, -1.0, -1.0], [1.0, 0.0, -1.0, 0.0], [0.0] * 4, [0.0] * 4, [0.0] * 4]
    assert compute_advantages(r, "max_rl").tolist() == want
    # an invalid member leaves the statistics: valid [1, 0, 0] has mean 1/3 -> [2, -1, -1, 0]
    valid = torch.tensor([[True, True, True, False]])
    out = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 5.0]], **f64), "max_rl", valid=valid)
    assert out.tolist()[0] == pytest.approx([2.0, -1.0, -1.0, 0.0], rel=1e-15)
    # not GRPO: GRPO divides the same centred rewards by the std (0.5 for the one-hot group)
    assert compute_advantages(ONE_HOT, "grpo").tolist()[0] == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)
    # a mean that is zero up to float32 rounding is not divided by (prime-rl would give ~2^31)
    tiny = torch.tensor([[1.0, -1.0 + 2.0 ** -30]], **f64)
    assert compute_advantages(tiny, "max_rl").tolist() == [[0.0, 0.0]]
    assert TOKEN_ESTIMATORS.requires_groups("max_rl")


def test_gpg_rescales_the_centred_reward_by_b_over_b_minus_m():
    """GPG: alpha (r - mean) / F_norm, alpha = B / (B - M) (float64, by hand)."""
    f64 = dict(dtype=torch.float64)
    # group 0 mean 3/8 -> r - mean = [5/8, -3/8, -3/8, 1/8]; group 1 is constant (M = 4 of B = 8): alpha 2
    r = torch.tensor([[1.0, 0.0, 0.0, 0.5], [1.0, 1.0, 1.0, 1.0]], **f64)
    assert compute_advantages(r, "gpg").tolist() == [[1.25, -0.75, -0.75, 0.25], [0.0] * 4]
    assert compute_advantages(r, "gpg", alpha="none").tolist() == [[0.625, -0.375, -0.375, 0.125], [0.0] * 4]
    # verl counts the non-zero rewards instead: 6 of 8 -> alpha 4/3
    nz = compute_advantages(r, "gpg", alpha="nonzero").tolist()[0]
    assert nz == pytest.approx([0.625 * 4 / 3, -0.375 * 4 / 3, -0.375 * 4 / 3, 0.125 * 4 / 3], rel=1e-15)
    # F_norm = the group's Bessel-corrected std + eps: var = (25 + 9 + 9 + 1) / 64 / 3 = 11/48
    std = math.sqrt(11 / 48)
    grp = compute_advantages(r, "gpg", scale="group", eps=1e-4).tolist()[0]
    assert grp == pytest.approx([2 * x / (std + 1e-4) for x in (0.625, -0.375, -0.375, 0.125)], rel=1e-14)
    # an invalid member leaves B and the group statistics; a group with one valid member is degenerate
    valid = torch.tensor([[True, True, True, False], [True, False, False, False]])
    out = compute_advantages(r, "gpg", valid=valid).tolist()
    assert out[0] == pytest.approx([(2 / 3) * 4 / 3, (-1 / 3) * 4 / 3, (-1 / 3) * 4 / 3, 0.0], rel=1e-15)
    assert out[1] == [0.0] * 4
    assert compute_advantages(torch.ones(2, 3, **f64), "gpg").tolist() == [[0.0] * 3] * 2  # all degenerate
    for bad, needle in (({"alpha": "paper"}, "advantage.alpha"), ({"scale": "batch"}, "advantage.scale"),
                        ({"eps": -1.0}, "advantage.eps")):
        with pytest.raises(ValueError, match=needle):
            compute_advantages(r, "gpg", **bad)


def test_requires_groups():
    assert requires_groups("grpo") and requires_groups("rloo") and requires_groups("mean_only")
    assert requires_groups("process") and requires_groups("reinforce_pp_baseline")
    assert not requires_groups("reinforce") and not requires_groups("reinforce_pp")
    assert not requires_groups("ppo")
    with pytest.raises(ValueError, match="grpo"):
        requires_groups("nope")
    # one registry: the outcome estimators are registered in it (broadcast to tokens), once
    assert {"grpo", "mean_only", "rloo", "reinforce", "grpo_passk", "max_rl", "gpg"} == set(outcome_names())
    assert set(outcome_names()) < set(TOKEN_ESTIMATORS.names())
    with pytest.raises(ValueError, match="token-level"):
        compute_advantages(ONE_HOT, "ppo")


def test_grpo_eps_enters_the_advantage():
    """eps is added to the std: with rewards [1, 0, 0, 0] the unbiased std is 0.5."""
    for eps in (1e-4, 1e-9, 0.25):
        assert close(compute_advantages(ONE_HOT, "grpo", eps=eps),
                     [[0.75 / (0.5 + eps), -0.25 / (0.5 + eps), -0.25 / (0.5 + eps), -0.25 / (0.5 + eps)]])


def test_rloo_loo_std_scaling_by_hand():
    """NeMo-RL leave-one-out baseline with normalize_rewards: each sample divided by the
    population std of the *other* members, left unscaled where that std is 0."""
    r = torch.tensor([[1.0, 0.0, 0.0, 2.0]])
    # i=0: others [0,0,2] mean 2/3, E[x^2] 4/3, std sqrt(4/3-4/9)=sqrt(8/9); A = (1-2/3)/sqrt(8/9)
    # i=1: others [1,0,2] mean 1, std sqrt(5/3-1)=sqrt(2/3); A = -1/sqrt(2/3); i=2 same
    # i=3: others [1,0,0] mean 1/3, std sqrt(1/3-1/9)=sqrt(2/9); A = (2-1/3)/sqrt(2/9)
    want = [(1 / 3) / math.sqrt(8 / 9), -1 / math.sqrt(2 / 3), -1 / math.sqrt(2 / 3), (5 / 3) / math.sqrt(2 / 9)]
    assert close(compute_advantages(r, "rloo", scale="loo_std"), [want])
    assert close(compute_advantages(r, "rloo"), [[1 - 2 / 3, -1.0, -1.0, 2 - 1 / 3]])  # scale=none
    # others all equal -> std 0: bounded, A = r - b (NeMo-RL's zero_std_mask), never r / 1e-6
    one = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    out = compute_advantages(one, "rloo", scale="loo_std")
    assert out[0, 0] == pytest.approx(1.0)  # others [0,0,0]: std 0, unscaled 1 - 0
    assert out[0, 1] == pytest.approx(-(1 / 3) / math.sqrt(1 / 3 - 1 / 9))
    with pytest.raises(ValueError, match="advantage.scale"):
        compute_advantages(one, "rloo", scale="std")


def test_grpo_passk_credits_only_the_best_sample():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    # group 0: gap 1 - .5 = .5 over the unbiased std (mean .375, var .6875/3); group 1 all equal;
    # group 2: a tie at the top -> gap 0
    std = math.sqrt(0.6875 / 3)
    assert close(compute_advantages(r, "grpo_passk"), [[0.5 / (std + 1e-6), 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    assert close(compute_advantages(r, "grpo_passk", scale=False)[0], [0.5, 0, 0, 0])


def test_remax_subtracts_the_greedy_reward_and_opo_the_length_weighted_mean():
    mask = _mask([2, 1, 3, 3], 3)
    ctx = AdvantageContext(scores=torch.tensor([[1.0, 0.0], [0.0, 1.0]]), token_rewards=torch.zeros(4, 3),
                           mask=mask, greedy_scores=torch.tensor([0.5, 1.0]))
    assert close(estimate_advantages("remax", ctx).advantages,
                 [[0.5, 0.5, 0.0], [-0.5, 0.0, 0.0], [-1.0, -1.0, -1.0], [0.0, 0.0, 0.0]])
    # OPO: b = sum L r / sum L: group 0 lengths (2, 1) -> b = 2/3; group 1 lengths (3, 3) -> b = 1/2
    assert close(estimate_advantages("opo", ctx).advantages,
                 [[1 / 3, 1 / 3, 0.0], [-2 / 3, 0.0, 0.0], [-0.5, -0.5, -0.5], [0.5, 0.5, 0.5]])
    with pytest.raises(ValueError, match="greedy_scores"):
        estimate_advantages("remax", AdvantageContext(ctx.scores, ctx.token_rewards, mask))


# ----------------------------------------------------------------- token broadcast


def _mask(lengths, T):
    return (torch.arange(T).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).float()


def test_token_grpo_broadcasts_over_valid_tokens():
    mask = _mask([2, 3], 3)
    ctx = AdvantageContext(scores=torch.tensor([[1.0, 0.0]]), token_rewards=torch.zeros(2, 3),
                           mask=mask)
    a = 1 / math.sqrt(2)  # mean .5, unbiased std sqrt(.5)
    out = estimate_advantages("grpo", ctx)
    assert close(out.advantages, [[a, a, 0.0], [-a, -a, -a]])
    assert out.returns is None


def test_token_estimator_excludes_empty_rows():
    mask = _mask([1, 1, 0], 2)
    ctx = AdvantageContext(scores=torch.tensor([[1.0, 0.0, 7.0]]),
                           token_rewards=torch.zeros(3, 2), mask=mask)
    out = estimate_advantages("mean_only", ctx)
    assert close(out.advantages, [[0.5, 0.0], [-0.5, 0.0], [0.0, 0.0]])


def test_token_reinforce_ema_uses_ctx_state():
    ctx = AdvantageContext(scores=torch.tensor([[1.0], [0.0]]), token_rewards=torch.zeros(2, 2),
                           mask=_mask([2, 1], 2))
    out = estimate_advantages("reinforce", ctx, baseline="ema")
    assert close(out.advantages, [[0.5, 0.5], [-0.5, 0.0]])
    assert ctx.state["ema"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="state"):  # state is not a parameter: it comes from ctx
        estimate_advantages("reinforce", ctx, baseline="ema", state={})


def test_token_estimator_errors():
    ctx = AdvantageContext(scores=torch.ones(2, 1), token_rewards=torch.zeros(2, 2),
                           mask=_mask([2, 1], 2))
    with pytest.raises(ValueError, match="group_size must be >= 2 for estimator 'grpo'"):
        estimate_advantages("grpo", ctx)
    with pytest.raises(ValueError) as e:
        estimate_advantages("gae", ctx)
    assert "ppo" in str(e.value) and "reinforce_pp" in str(e.value)
    bad = AdvantageContext(scores=torch.ones(1, 3), token_rewards=torch.zeros(2, 2),
                           mask=_mask([2, 1], 2))
    with pytest.raises(ValueError, match="P\\*G"):
        estimate_advantages("reinforce", bad)


# ----------------------------------------------------------------- utils / registry


def test_masked_mean_var_whiten():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert float(masked_mean(x, m)) == pytest.approx(2.0)
    assert float(masked_var(x, m)) == pytest.approx(1.0)
    assert float(masked_var(x, m, unbiased=False)) == pytest.approx(2 / 3)
    assert close(masked_whiten(x, m), [-1.0, 0.0, 1.0, 0.0])
    assert close(masked_whiten(x, m, shift_mean=False), [1.0, 2.0, 3.0, 0.0])
    assert float(masked_mean(x, torch.zeros(4))) == 0.0
    with pytest.raises(ValueError, match="mask"):
        masked_mean(x, torch.ones(3))


def test_pass_at_k():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 1, 4) == pytest.approx(1.0)
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 5, 3) == 1.0 and pass_at_k(4, 4, 2) == 1.0
    for bad in [(4, 1, 5), (4, 5, 1), (0, 0, 1), (4, 1, 0), (4, -1, 1), (4.0, 1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(*bad)


def test_explained_variance():
    y = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(y, y) == pytest.approx(1.0)
    assert explained_variance(torch.full((3,), 2.0), y) == pytest.approx(0.0)
    assert math.isnan(explained_variance(y, torch.ones(3)))


def test_registry():
    from dataclasses import dataclass

    reg = Registry("widget")

    @dataclass
    class AParams:
        name: str = "a"
        k: float = 2.0

    @reg.register("a", params=AParams, needs=("values",))
    def a(p):
        return p.k

    assert reg.get("a") is a and reg.names() == ["a"] and "a" in reg
    spec = reg.spec("a")
    assert spec.needs == {"values"} and spec.param_names() == ["k"]
    assert spec.build().k == 2.0 and spec.build({"name": "a", "k": 3}).k == 3 and spec.build(k=5).k == 5
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['kk'\] for 'a'; accepted: \['k'\]"):
        spec.build({"kk": 1})  # a typo is an error, never filtered away
    with pytest.raises(ValueError, match="named 'b'"):
        spec.build({"name": "b"})
    with pytest.raises(ValueError, match="already"):
        reg.register("a")(a)
    with pytest.raises(ValueError, match="valid names: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="registered as widget 'c'"):
        reg.register("c", params=AParams)


def test_every_estimator_declares_its_params_once():
    """The registered params dataclass is the estimator's schema; the functions have no defaults."""
    import inspect

    for name in TOKEN_ESTIMATORS.names():
        spec = TOKEN_ESTIMATORS.spec(name)
        assert spec.params is not None, name
        sig = inspect.signature(spec.fn)
        assert list(sig.parameters) == ["ctx", "p"], (name, list(sig.parameters))
        assert all(p.default is inspect.Parameter.empty for p in sig.parameters.values()), name


def _nemo_rl_loo(rewards: torch.Tensor, bessel: bool, eps: float) -> torch.Tensor:
    """NeMo-RL's ``calculate_baseline_and_std_per_prompt`` (leave-one-out) followed by its GRPO
    estimator's ``normalize_rewards``, written out from their formulas in float64: per member,
    ``b = mean of the others``, ``std = sqrt(mean of the others' squares - b^2)``, times
    ``m / (m - 1)`` under the variance since PR #1423 (``m`` others; NaN -> 0), and
    ``A = (r - b) / (std + eps)`` where ``std > 0``, else ``r - b``."""
    out = torch.empty_like(rewards, dtype=torch.float64)
    for p, row in enumerate(rewards.double()):
        n = len(row)
        for i in range(n):
            others = torch.cat([row[:i], row[i + 1:]])
            m = n - 1
            b = others.sum() / m
            var = (others.square().sum() / m - b * b)
            if bessel:
                var = var * (m / (m - 1)) if m > 1 else torch.tensor(float("nan"))
            std = torch.nan_to_num(var.clamp(min=0).sqrt(), 0.0)
            out[p, i] = (row[i] - b) / (std + eps) if std > 0 else row[i] - b
    return out


def test_nemo_rl_calculate_baseline_and_std_per_prompt_leave_one_out():
    """Golden: NeMo-RL `nemo_rl/algorithms/utils.py` `calculate_baseline_and_std_per_prompt`
    (`leave_one_out_baseline=true`) with `nemo_rl/algorithms/advantage_estimator.py`
    `GRPOAdvantageEstimator.compute_advantage` (`normalize_rewards=true`), read at 7ea279a (since
    PR #1423, 2025-11-13: Bessel-corrected, eps 1e-6) and at the PR's parent 7124e44^ (population,
    eps 0), on 4 groups of G=5; the two differ by sqrt(4/3). Harness: `advantage=rloo
    advantage.scale=loo_std` (before) and `... advantage.unbiased=true advantage.eps=1e-6` (since)."""
    r = torch.tensor([[0.0, 1.0, 1.0, 0.5, 0.2], [1.0, 0.0, 0.0, 0.0, 0.3],
                      [0.7, 0.7, 0.1, 0.9, 0.4], [0.25, 1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    old = compute_advantages(r, "rloo", scale="loo_std")
    new = compute_advantages(r, "rloo", scale="loo_std", unbiased=True, eps=1e-6)
    torch.testing.assert_close(old, _nemo_rl_loo(r, bessel=False, eps=0.0), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(new, _nemo_rl_loo(r, bessel=True, eps=1e-6), rtol=1e-12, atol=1e-12)
    # the knob is on: every member's scale differs by sqrt(m/(m-1)) = sqrt(4/3) (eps aside)
    assert (old / new).flatten().tolist() == pytest.approx([(4 / 3) ** 0.5] * 20, rel=1e-5)
    # G = 2: one other member, no Bessel-corrected spread: NeMo-RL's NaN -> 0, unscaled r - b
    two = torch.tensor([[0.0, 1.0]], dtype=torch.float64)
    assert compute_advantages(two, "rloo", scale="loo_std", unbiased=True).tolist() == [[-1.0, 1.0]]
