"""Every registered policy loss against values and gradients computed by hand, including the
branch it exists for (a clipped token, a gated token, a selected high-covariance token)."""

from __future__ import annotations

import math

import pytest
import torch

from harness.algo import POLICY_LOSSES


def flat(t):
    return t.flatten().tolist()


def _run(name, ratios, advs, mask=None, weights=None, **params):
    """One row per token list; old log-prob 0 so exp(logp) is the ratio. Returns (loss, stats, grad)."""
    logp = torch.log(torch.tensor(ratios, dtype=torch.float64)).requires_grad_()
    old = torch.zeros_like(logp)
    adv = torch.tensor(advs, dtype=torch.float64)
    mask = torch.ones_like(old) if mask is None else torch.tensor(mask, dtype=torch.float64)
    spec = POLICY_LOSSES.spec(name)
    loss, stats = spec.fn(logp, old, adv, mask, spec.build(**params), weights=weights)
    loss.sum().backward()
    return loss.detach(), stats, logp.grad


def test_registry_lists_every_loss_with_params():
    assert set(POLICY_LOSSES.names()) == {"ppo_clip", "gspo", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov", "pg",
                                          "vespo", "dppo"}
    for name in POLICY_LOSSES.names():
        assert POLICY_LOSSES.spec(name).params is not None
    assert POLICY_LOSSES.spec("gspo").aggregation == "seq-mean-token-mean"
    assert POLICY_LOSSES.spec("ppo_clip").aggregation is None


def test_ppo_clip_clips_and_dual_clips():
    # A=1, r=1.5: clipped at 1.2, no gradient; A=-1, r=5: PPO loss 5, dual clip c=3 bounds it at 3
    loss, stats, grad = _run("ppo_clip", [[1.5, 5.0]], [[1.0, -1.0]], dual_clip=3.0)
    assert flat(loss) == pytest.approx([-1.2, 3.0])
    assert flat(grad) == [0.0, 0.0]
    assert float(stats["clip_frac_high"]) == 0.5 and float(stats["dual_clip_frac"]) == 0.5


def test_ppo_clip_delta_caps_the_unclipped_ratio_on_both_sides():
    """TRL delta (INTELLECT-2 two-sided clipping): -min(min(r, delta) A, clip(r) A), float64."""
    # delta 4, eps 0.2. A=-1, r=5: max(4, 1.2) = 4, capped (no gradient); A=1, r=5: max(-4, -1.2) =
    # -1.2, clipped as PPO; A=-1, r=3 < delta: 3, gradient -A r = 3; A=-1, r=0.5: max(0.5, 0.8) = 0.8
    loss, stats, grad = _run("ppo_clip", [[5.0, 5.0, 3.0, 0.5]], [[-1.0, 1.0, -1.0, -1.0]], delta=4.0)
    assert flat(loss) == pytest.approx([4.0, -1.2, 3.0, 0.8], rel=1e-14)
    assert flat(grad) == pytest.approx([0.0, 0.0, 3.0, 0.0], rel=1e-14, abs=0)
    assert float(stats["delta_clip_frac"]) == 0.25 and float(stats["clip_frac"]) == 0.5
    plain_loss, plain_stats, _ = _run("ppo_clip", [[5.0, 5.0, 3.0, 0.5]], [[-1.0, 1.0, -1.0, -1.0]])
    assert flat(plain_loss)[0] == pytest.approx(5.0) and "delta_clip_frac" not in plain_stats  # off by default
    # delta >= 1 + eps_high is dual-clip with c = delta, in value and gradient
    g = torch.Generator().manual_seed(0)
    ratios = torch.exp(torch.randn(3, 7, generator=g, dtype=torch.float64) * 1.5).tolist()
    advs = torch.randn(3, 7, generator=g, dtype=torch.float64).tolist()
    a = _run("ppo_clip", ratios, advs, delta=2.5)
    b = _run("ppo_clip", ratios, advs, dual_clip=2.5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2], b[2])
    assert float(a[1]["delta_clip_frac"]) == float(b[1]["dual_clip_frac"]) > 0
    # 1 < delta < 1 + eps_high also caps a positive-advantage token: A=1, r=1.15 -> -1.1, no gradient
    loss, stats, grad = _run("ppo_clip", [[1.15]], [[1.0]], delta=1.1)
    assert flat(loss) == pytest.approx([-1.1], rel=1e-14) and flat(grad) == [0.0]
    assert float(stats["delta_clip_frac"]) == 1.0
    with pytest.raises(ValueError, match="policy_loss.delta must be None or > 1"):
        _run("ppo_clip", [[1.0]], [[1.0]], delta=1.0)


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # row ratios 1.1 and 1.0 -> s = exp(mean log r) = sqrt(1.1); eps 3e-4/4e-4 clips it (A > 0)
    loss, stats, grad = _run("gspo", [[1.1, 1.0]], [[1.0, 1.0]])
    s = math.sqrt(1.1)
    assert flat(loss) == pytest.approx([-(1 + 4e-4)] * 2)  # clipped: -(1 + eps_high) A
    assert flat(grad) == [0.0, 0.0] and float(stats["clip_frac"]) == 1.0
    loss, _, grad = _run("gspo", [[1.1, 1.0]], [[1.0, 1.0]], epsilon=1.0, epsilon_high=1.0)
    assert flat(loss) == pytest.approx([-s, -s])
    assert flat(grad) == pytest.approx([-s, -s])  # d(-A s_it)/dlogp_t = -A sg(s_i)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # r = 8 > 1 + eps_high = 5: the weight is 5 (stop-gradient), the token still gets -5 A dlogp
    loss, stats, grad = _run("cispo", [[8.0, 0.5]], [[1.0, 1.0]])
    assert flat(loss) == pytest.approx([-5.0 * math.log(8.0), -0.5 * math.log(0.5)])
    assert flat(grad) == pytest.approx([-5.0, -0.5])  # no lower bound by default: 0.5 kept
    assert float(stats["clip_frac"]) == 0.5
    _, _, grad = _run("cispo", [[8.0, 0.5]], [[1.0, 1.0]], epsilon_low=0.2)
    assert flat(grad) == pytest.approx([-5.0, -0.8])  # lower bound 0.8


def test_sapo_gate_by_hand():
    # f(r) = sigmoid(tau (r - 1)) 4 / tau; tau_pos for A > 0, tau_neg for A < 0
    r, taus = [1.0, 1.5, 1.5], [1.0, 1.0, 1.05]
    loss, stats, grad = _run("sapo", [r], [[1.0, 1.0, -1.0]])
    sig = [1 / (1 + math.exp(-t * (x - 1))) for x, t in zip(r, taus)]
    want = [-sig[0] * 4 / taus[0], -sig[1] * 4 / taus[1], sig[2] * 4 / taus[2]]
    assert flat(loss) == pytest.approx(want)
    # d/dlogp = -A * 4 sigma (1 - sigma) * r  (chain rule through r = exp(logp))
    g = [-a * 4 * s * (1 - s) * x for a, s, x in zip([1.0, 1.0, -1.0], sig, r)]
    assert flat(grad) == pytest.approx(g)
    assert g[0] == pytest.approx(-1.0)  # on-policy the gate's gradient equals PPO's
    far, stats, _ = _run("sapo", [[4.0]], [[1.0]])
    assert float(stats["clip_frac"]) == 1.0  # far off-policy: the gate has decayed


def test_sapo_zero_advantage_takes_tau_neg():
    """A token with A = 0 takes tau_neg (verl b178a3c, `verl/trainer/ppo/core_algos.py`
    `compute_policy_loss_sapo`: `tau_pos` if `A > 0`, else `tau_neg`; TRL f2cd577 the same). Its
    loss and gradient are 0 under either tau (`-f_tau(r) * 0`), so only the `clip_frac` metric
    tells the two apart: at r = 2.72 the gate weight `4 sigma (1 - sigma)` is 0.497 < 1/2 with
    tau_neg = 1.05 (gated) and 0.512 with tau_pos = 1.0 (not gated)."""
    loss, stats, grad = _run("sapo", [[2.72]], [[0.0]])
    assert flat(loss) == [0.0] and flat(grad) == [0.0]
    s_neg, s_pos = (1 / (1 + math.exp(-t * 1.72)) for t in (1.05, 1.0))
    assert 4 * s_neg * (1 - s_neg) < 0.5 < 4 * s_pos * (1 - s_pos)
    assert float(stats["clip_frac"]) == 1.0 and float(stats["clip_frac_high"]) == 1.0


def test_vespo_gamma_weight_of_the_sequence_ratio_by_hand():
    """phi = W^k exp(lambda (1 - W)), W the product of the row's token ratios; (k, lambda) =
    (2, 3) for A >= 0 and (3, 2) for A < 0; L = -phi A log pi with phi detached."""
    rows = [[1.2, 0.9], [2.0, 2.0]]
    loss, stats, grad = _run("vespo", rows, [[1.0, 1.0], [-1.0, -1.0]])
    w0, w1 = 1.2 * 0.9, 2.0 * 2.0
    phi0 = w0 ** 2 * math.exp(3 * (1 - w0))
    phi1 = w1 ** 3 * math.exp(2 * (1 - w1))
    want = [-phi0 * math.log(1.2), -phi0 * math.log(0.9), phi1 * math.log(2.0), phi1 * math.log(2.0)]
    assert flat(loss) == pytest.approx(want, rel=1e-12)
    assert flat(grad) == pytest.approx([-phi0, -phi0, phi1, phi1], rel=1e-12)  # d/dlogp of -sg(phi) A logp
    assert phi1 < 0.5 < phi0 and float(stats["clip_frac_high"]) == 0.5 and float(stats["clip_frac"]) == 0.5
    # on-policy phi(1) = 1: the gradient is plain PG's -A; a masked token leaves W untouched
    loss, _, grad = _run("vespo", [[1.0, 3.0]], [[2.0, 2.0]], mask=[[1.0, 0.0]])
    assert flat(grad) == pytest.approx([-2.0, 0.0], rel=1e-14) and flat(loss) == [0.0, 0.0]
    # the knobs act: k_pos=0, lambda_pos=1 gives phi = exp(1 - W)
    _, _, grad = _run("vespo", [[1.2, 0.9]], [[1.0, 1.0]], k_pos=0.0, lambda_pos=1.0)
    assert flat(grad) == pytest.approx([-math.exp(1 - w0)] * 2, rel=1e-12)
    with pytest.raises(ValueError, match="policy_loss.lambda_neg must be > 0"):
        _run("vespo", [[1.0]], [[1.0]], lambda_neg=0.0)


def test_gmpo_geometric_mean_with_log_space_clip():
    # A=1: log r = [log 2, log 0.5] clipped to [-0.4, 0.4] on the upper side only (min with sgn A)
    loss, stats, grad = _run("gmpo", [[2.0, 0.5]], [[1.0, 1.0]])
    lr = [min(math.log(2.0), 0.4), math.log(0.5)]  # sgn(A)=1: min(lr, clip(lr)) = [0.4, log .5]
    seq = -math.exp(sum(lr) / 2)
    assert flat(loss) == pytest.approx([seq, seq])
    # the clipped token has no gradient; the other gets d(seq)/dlogp = seq / L, summed over the
    # L copies of the row's loss: with seq-mean-token-mean each copy weighs 1/L
    assert grad[0, 0] == 0.0 and float(grad[0, 1]) == pytest.approx(2 * seq / 2)
    assert float(stats["clip_frac"]) == 1.0  # both tokens' log-ratios are outside [-0.4, 0.4]


def test_clip_cov_detaches_a_selected_high_covariance_token():
    torch.manual_seed(0)
    # logp = [2, 0, 0, 0] (mean .5), A = [2, -1, 0, -1] (mean 0): covariances [3, .5, 0, .5]
    ratios = [[math.e ** 2, 1.0, 1.0, 1.0]]
    advs = [[2.0, -1.0, 0.0, -1.0]]
    loss, stats, grad = _run("clip_cov", ratios, advs, epsilon=100.0, clip_cov_ratio=0.25)
    # only token 0 lies in (lb, ub) = (1, 5); k = max(1, 0.25 * 4) = 1 token is detached
    assert float(stats["cov_selected_frac"]) == 0.25
    assert loss[0, 0] == 0.0 and grad[0, 0] == 0.0  # the selected token: no loss, no gradient
    assert grad[0, 1].item() == pytest.approx(1.0)  # the others: PPO's -A r
    _, stats, grad = _run("clip_cov", ratios, advs, epsilon=100.0, clip_cov_lb=3.5)  # none qualifies
    assert float(stats["cov_selected_frac"]) == 0.0 and grad[0, 0].item() == pytest.approx(-2 * math.e ** 2)
    _, stats, grad = _run("clip_cov", ratios, advs, epsilon=100.0, clip_cov_lb=0.1, clip_cov_ratio=0.25)
    assert float(stats["cov_selected_frac"]) == 0.25  # one of tokens 0, 1, 3 (token 2 has cov 0)
    assert sum(float(g == 0.0) for g in grad[0, [0, 1, 3]]) == 1


def test_kl_cov_penalises_the_top_covariance_token():
    ratios = [[math.e ** 2, math.e ** 0.5, 1.0, 1.0]]
    advs = [[2.0, -1.0, 0.0, -1.0]]
    loss, stats, grad = _run("kl_cov", ratios, advs, kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    # token 0 has the top covariance: loss -A r + 0.5 |log r| = -2 e^2 + 1, gradient -A r + 0.5
    assert loss[0, 0].item() == pytest.approx(-2 * math.e ** 2 + 0.5 * 2.0)
    assert grad[0, 0].item() == pytest.approx(-2 * math.e ** 2 + 0.5)
    assert loss[0, 1].item() == pytest.approx(1.0 * math.e ** 0.5)  # unselected: -A r only
    assert float(stats["cov_selected_frac"]) == 0.25


def test_pg_has_no_ratio_and_weights_multiply():
    loss, stats, grad = _run("pg", [[2.0, 0.5]], [[1.0, -2.0]])
    assert flat(loss) == pytest.approx([-math.log(2.0), 2 * math.log(0.5)])
    assert flat(grad) == pytest.approx([-1.0, 2.0])
    w = torch.tensor([[0.5, 3.0]], dtype=torch.float64)
    loss, _, grad = _run("pg", [[2.0, 0.5]], [[1.0, -2.0]], weights=w)
    assert flat(grad) == pytest.approx([-0.5, 6.0])


def test_masked_tokens_carry_no_loss_or_gradient():
    for name in POLICY_LOSSES.names():
        loss, _, grad = _run(name, [[1.3, 0.7, 9.0]], [[1.0, -1.0, 5.0]], mask=[[1.0, 1.0, 0.0]])
        assert loss[0, 2] == 0.0 and grad[0, 2] == 0.0, name


def test_bad_params_name_the_key():
    with pytest.raises(ValueError, match="policy_loss.tau_pos"):
        _run("sapo", [[1.0]], [[1.0]], tau_pos=0.0)
    with pytest.raises(ValueError, match="policy_loss.clip_cov_ratio"):
        _run("clip_cov", [[1.0]], [[1.0]], clip_cov_ratio=0.0)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['epsilon'\] for 'sapo'"):
        _run("sapo", [[1.0]], [[1.0]], epsilon=0.2)


def test_dppo_masks_by_probability_difference_by_hand():
    # pi_old / pi per token, A per token:
    #   a: 0.5 -> 0.8, A = +1: d = +0.3 > 0.2 -> dropped (high side)
    #   b: 0.5 -> 0.6, A = +1: d = +0.1 -> kept, L = -1 * 0.6 / 0.5 = -1.2
    #   c: 0.5 -> 0.2, A = -1: d = -0.3 < -0.2 -> dropped (low side)
    #   d: 0.05 -> 0.2, A = +1: ratio 4 but d = +0.15 -> kept, L = -4 (PPO's clip would stop at 1.2)
    #   e: 0.5 -> 0.8, A = -1: d = +0.3, only the low side applies to A < 0 -> kept, L = +1.6
    old = torch.tensor([[0.5, 0.5, 0.5, 0.05, 0.5]], dtype=torch.float64).log()
    new = torch.tensor([[0.8, 0.6, 0.2, 0.2, 0.8]], dtype=torch.float64).log().requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.float64)
    spec = POLICY_LOSSES.spec("dppo")
    loss, stats = spec.fn(new, old, adv, mask, spec.build())
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.0, -1.2, 0.0, -4.0, 1.6]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    loss.sum().backward()  # d/dlogp of -A r = -A r on kept tokens, 0 on dropped ones
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, -1.2, 0.0, -4.0, 1.6]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    assert float(stats["clip_frac_high"]) == pytest.approx(0.2) and float(stats["clip_frac_low"]) == pytest.approx(0.2)
    # kl_coef adds kl_coef * (log r)^2 on every token, dropped or not: token a gets 0.1 * log(1.6)^2
    loss, _ = spec.fn(new, old, adv, mask, spec.build(kl_coef=0.1))
    assert float(loss[0, 0]) == pytest.approx(0.1 * math.log(1.6) ** 2, abs=1e-12)
    assert float(loss[0, 1]) == pytest.approx(-1.2 + 0.1 * math.log(1.2) ** 2, abs=1e-12)
    # a wider region keeps every token: a = -1.6, c = +1 * 0.4 = 0.4
    loss, _ = spec.fn(new, old, adv, mask, spec.build(mask_low=0.5, mask_high=0.5))
    torch.testing.assert_close(loss.detach(), torch.tensor([[-1.6, -1.2, 0.4, -4.0, 1.6]], dtype=torch.float64),
                               rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="policy_loss.mask_low must be >= 0"):
        spec.fn(new, old, adv, mask, spec.build(mask_low=-0.1))


# the params of each loss that act on-policy too (every other numeric param is a declared ratio param)
ACTS_ON_POLICY = {"clip_cov": {"clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"}}
NONE_DEFAULT_OTHER = {"dual_clip": 1.5, "delta": 1.5}  # a valid value for a param whose default is None


def test_every_policy_loss_param_is_a_ratio_param_or_acts_on_policy():
    """A loss added without classifying its params fails here: a param that only acts through the
    ratio must be declared (``ratio_params``), or startup cannot warn when mu=1 makes it inert."""
    for name in POLICY_LOSSES.names():
        spec = POLICY_LOSSES.spec(name)
        assert set(spec.ratio_params) | ACTS_ON_POLICY.get(name, set()) == set(spec.param_names()), name
    assert POLICY_LOSSES.spec("ppo_clip").ratio_params == {"epsilon", "epsilon_high", "dual_clip", "delta"}


@pytest.mark.parametrize("name", [n for n in POLICY_LOSSES.names() if POLICY_LOSSES.spec(n).ratio_params])
def test_ratio_params_change_no_gradient_where_every_ratio_is_one(name):
    """pi_old = pi (mu=1 on-policy): a declared ratio param set to another valid value leaves the
    gradient as it was, in float64 (summation order aside), on a batch with both signs of advantage
    and a padded row. The same params set at ratios away from 1 change it: tests/test_knobs.py's rows
    for them run at mu=2."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 8, dtype=torch.float64, generator=g) - 1.0
    adv = torch.randn(6, 1, dtype=torch.float64, generator=g).expand(6, 8).contiguous()
    mask = torch.ones(6, 8, dtype=torch.float64)
    mask[0, 5:] = 0
    spec = POLICY_LOSSES.spec(name)
    default = spec.build()

    def grad(params):
        torch.manual_seed(0)  # clip_cov draws its detached tokens at random
        logp = base.clone().requires_grad_()
        loss, _ = spec.fn(logp, logp.detach(), adv, mask, params)
        loss.sum().backward()
        return logp.grad

    ref = grad(default)
    assert ref.abs().sum() > 0
    for key in sorted(spec.ratio_params):
        v = getattr(default, key)
        other = NONE_DEFAULT_OTHER.get(key, 0.3) if v is None else v * 1.7 + 0.05
        torch.testing.assert_close(grad(spec.build(**{key: other})), ref, rtol=1e-12, atol=1e-15,
                                   msg=lambda m: f"policy_loss={name} {key}={other}: {m}")
