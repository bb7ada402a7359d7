"""Policy / value losses and loss aggregation, hand-computed."""

import math

import pytest
import torch

from harness.algo import LOSS_AGGREGATIONS, aggregate_loss, policy_loss, value_loss
from harness.algo.aggregation import aggregation_normalizers


def _pl(ratio, adv, **kw):
    """policy_loss on single tokens with given ratios (old logprob 0)."""
    logp = torch.log(torch.tensor([ratio], dtype=torch.float32)).reshape(-1, 1).requires_grad_()
    loss, stats = policy_loss(logp, torch.zeros_like(logp), torch.tensor([[adv]] * logp.shape[0]),
                              torch.ones_like(logp), **kw)
    return logp, loss, stats


# ----------------------------------------------------------------- policy loss


def test_ratio_one_gives_minus_advantage_and_no_clipping():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], requires_grad=True)
    adv = torch.tensor([[2.0], [-0.5]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = policy_loss(logp, logp.detach(), adv, mask, epsilon=0.2)
    assert torch.allclose(loss, torch.tensor([[-2.0, -2.0, -2.0], [0.5, 0.5, 0.0]]))
    for key in ("clip_frac_low", "clip_frac_high", "clip_frac", "dual_clip_frac", "approx_kl"):
        assert float(stats[key]) == 0.0
    assert float(stats["ratio_mean"]) == pytest.approx(1.0)
    loss.sum().backward()  # d(-A * r)/dlogp = -A * r = -A at r = 1
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -2.0, -2.0], [0.5, 0.5, 0.0]]))


def test_clip_high_positive_advantage():
    logp, loss, stats = _pl(1.5, 1.0, epsilon=0.2)
    assert loss.item() == pytest.approx(-1.2)
    assert float(stats["clip_frac_high"]) == 1.0 and float(stats["clip_frac_low"]) == 0.0
    assert float(stats["clip_frac"]) == 1.0
    assert float(stats["approx_kl"]) == pytest.approx(0.5 - math.log(1.5), abs=1e-6)
    loss.sum().backward()
    assert float(logp.grad) == 0.0  # clipped: no gradient


def test_clip_low_negative_advantage():
    _, loss, stats = _pl(0.5, -1.0, epsilon=0.2)
    assert loss.item() == pytest.approx(0.8)  # max(0.5, 0.8)
    assert float(stats["clip_frac_low"]) == 1.0 and float(stats["clip_frac_high"]) == 0.0


def test_pessimistic_side_is_not_clipped():
    # A < 0 with ratio above 1 + eps and A > 0 with ratio below 1 - eps keep the raw term
    logp, loss, stats = _pl(1.5, -1.0, epsilon=0.2)
    assert loss.item() == pytest.approx(1.5) and float(stats["clip_frac"]) == 0.0
    loss.sum().backward()
    assert float(logp.grad) == pytest.approx(1.5)  # d(-A r)/dlogp = -A r
    _, loss, stats = _pl(0.5, 1.0, epsilon=0.2)
    assert loss.item() == pytest.approx(-0.5) and float(stats["clip_frac"]) == 0.0


def test_epsilon_high_differs_from_epsilon():
    _, loss, stats = _pl(1.25, 1.0, epsilon=0.2, epsilon_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and float(stats["clip_frac_high"]) == 0.0
    _, sym, _ = _pl(1.25, 1.0, epsilon=0.2)
    assert sym.item() == pytest.approx(-1.2)
    _, loss, _ = _pl(1.5, 1.0, epsilon=0.2, epsilon_high=0.28)
    assert loss.item() == pytest.approx(-1.28)
    _, loss, _ = _pl(0.5, -1.0, epsilon=0.2, epsilon_high=0.28)  # low side still uses epsilon
    assert loss.item() == pytest.approx(0.8)


def test_dual_clip():
    # A = -1, ratio 5: PPO loss max(5, 1.2) = 5; dual clip c = 3 bounds it at -c*A = 3
    logp, loss, stats = _pl(5.0, -1.0, epsilon=0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx(3.0) and float(stats["dual_clip_frac"]) == 1.0
    loss.sum().backward()
    assert float(logp.grad) == 0.0
    _, loss, _ = _pl(5.0, -1.0, epsilon=0.2)
    assert loss.item() == pytest.approx(5.0)
    _, loss, stats = _pl(2.0, -1.0, epsilon=0.2, dual_clip=3.0)  # ratio < c: inactive
    assert loss.item() == pytest.approx(2.0) and float(stats["dual_clip_frac"]) == 0.0
    _, loss, _ = _pl(5.0, 1.0, epsilon=0.2, dual_clip=3.0)  # A > 0: unaffected
    assert loss.item() == pytest.approx(-1.2)
    with pytest.raises(ValueError, match="dual_clip"):
        _pl(1.0, 1.0, epsilon=0.2, dual_clip=1.0)


def test_gspo_sequence_ratio():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -1.9, -0.9], [-0.3, -0.2, 4.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # mean log-ratio: row0 (.2 - .1 + .4)/3 = 1/6, row1 (0 - .5)/2 = -.25
    s = torch.tensor([math.exp(1 / 6), math.exp(-0.25)])
    adv = torch.tensor([[-1.0], [-1.0]])
    loss, stats = policy_loss(logp, old, adv, mask, epsilon=10.0, ratio_level="sequence")
    expected = torch.stack([s[0].expand(3), torch.tensor([s[1], s[1], 0.0])])
    assert torch.allclose(loss, expected, atol=1e-6)  # -A * s_i at valid tokens
    assert float(stats["ratio_mean"]) == pytest.approx(float((3 * s[0] + 2 * s[1]) / 5), abs=1e-6)
    loss.sum().backward()  # GSPO-token: d/dlogp_t = -A * sg(s_i) per valid token
    assert torch.allclose(logp.grad, expected, atol=1e-6)
    # clipping acts on the sequence ratio: s0 = 1.18 > 1 + 0.1 with A > 0 -> clipped
    loss, stats = policy_loss(logp, old, -adv, mask, epsilon=0.1, ratio_level="sequence")
    assert torch.allclose(loss[0], torch.full((3,), -1.1))
    assert float(stats["clip_frac_high"]) == pytest.approx(3 / 5)


def test_advantage_broadcast_and_errors():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    old = logp - 0.1
    mask = torch.ones(2, 2)
    a1, _ = policy_loss(logp, old, torch.tensor([1.0, -2.0]), mask, epsilon=0.2)
    a2, _ = policy_loss(logp, old, torch.tensor([[1.0], [-2.0]]), mask, epsilon=0.2)
    a3, _ = policy_loss(logp, old, torch.tensor([[1.0, 1.0], [-2.0, -2.0]]), mask, epsilon=0.2)
    assert torch.equal(a1, a2) and torch.equal(a2, a3)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, torch.ones(3, 1), mask, epsilon=0.2)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(logp, old[:, :1], torch.ones(2, 1), mask, epsilon=0.2)
    with pytest.raises(ValueError, match="epsilon"):
        policy_loss(logp, old, torch.ones(2, 1), mask, epsilon=-0.1)
    with pytest.raises(ValueError) as e:
        policy_loss(logp, old, torch.ones(2, 1), mask, epsilon=0.2, ratio_level="seq")
    assert "sequence" in str(e.value) and "token" in str(e.value)


def test_nan_padding_does_not_leak():
    logp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    old = torch.tensor([[-1.0, float("nan")]])
    loss, stats = policy_loss(logp, old, torch.ones(1, 1), torch.tensor([[1.0, 0.0]]),
                              epsilon=0.2)
    assert loss.tolist() == [[-1.0, 0.0]]
    assert all(math.isfinite(float(v)) for v in stats.values())
    loss.sum().backward()
    assert torch.isfinite(logp.grad).all()


# ----------------------------------------------------------------- value loss


def test_value_loss_clipping():
    values = torch.tensor([[1.5, 1.1, 0.5, 7.0]], requires_grad=True)
    old = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    returns = torch.tensor([[2.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, clip_range=0.2)
    # t0: unclipped .25, clipped (1.2-2)^2 = .64 -> .32 ; t1: v within range -> .5*.81
    # t2: unclipped .25, clipped (.8-0)^2 = .64 -> .32 ; t3 masked
    assert torch.allclose(loss, torch.tensor([[0.32, 0.405, 0.32, 0.0]]))
    assert float(stats["vf_clip_frac"]) == pytest.approx(2 / 3)
    loss.sum().backward()
    assert torch.allclose(values.grad, torch.tensor([[0.0, -0.9, 0.0, 0.0]]))
    unclipped, st = value_loss(values, old, returns, mask, clip_range=None)
    assert torch.allclose(unclipped, torch.tensor([[0.125, 0.405, 0.125, 0.0]]))
    assert float(st["vf_clip_frac"]) == 0.0
    with pytest.raises(ValueError, match="returns"):
        value_loss(values, old, returns[:, :2], mask, clip_range=0.2)


# ----------------------------------------------------------------- aggregation

X = torch.tensor([[2.0, 2, 2, 2, 2, 6, 5, 3, 2, 4], [10.0, 3, 4, 5, 2, 3, 4, 1, 1, 3]])
M = torch.zeros(2, 10)
M[0, :5] = 1
M[1, :1] = 1


def test_aggregation_values():
    assert float(aggregate_loss(X, M, "token-mean")) == pytest.approx(20 / 6)  # 3.3333
    assert float(aggregate_loss(X, M, "seq-mean-token-mean")) == pytest.approx(6.0)  # (2+10)/2
    assert float(aggregate_loss(X, M, "seq-mean-token-sum")) == pytest.approx(10.0)  # (10+10)/2
    assert float(aggregate_loss(X, M, "seq-mean-token-sum-norm", constant=10)) == pytest.approx(1.0)


def test_aggregation_conventions_by_hand():
    """The peer conventions: verl drops 1/N_seq in seq-mean-token-sum-norm; TRL's grpo and
    dr_grpo divide by all B rows (fully masked ones too)."""
    X3 = torch.cat([X, torch.full((1, 10), 7.0)])
    M3 = torch.cat([M, torch.zeros(1, 10)])  # a third, fully masked row
    assert float(aggregate_loss(X3, M3, "seq-mean-token-mean")) == pytest.approx(12 / 2)
    assert float(aggregate_loss(X3, M3, "seq-mean-token-mean", count_masked_rows=True)) == pytest.approx(12 / 3)
    assert float(aggregate_loss(X3, M3, "seq-mean-token-sum", count_masked_rows=True)) == pytest.approx(20 / 3)
    norm = "seq-mean-token-sum-norm"
    assert float(aggregate_loss(X3, M3, norm, constant=10)) == pytest.approx(20 / 10 / 2)
    assert float(aggregate_loss(X3, M3, norm, constant=10, divide_by_seqs=False)) == pytest.approx(20 / 10)
    assert float(aggregate_loss(X3, M3, norm, constant=10, count_masked_rows=True)) == pytest.approx(20 / 10 / 3)
    # constant=None falls back to the generation cap max_len
    assert float(aggregate_loss(X3, M3, norm, max_len=4)) == pytest.approx(20 / 4 / 2)
    assert float(aggregate_loss(X3, M3, "token-mean")) == pytest.approx(20 / 6)


def test_aggregation_errors():
    with pytest.raises(ValueError, match="constant"):
        aggregate_loss(X, M, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="accepted: none"):
        aggregate_loss(X, M, "token-mean", constant=10)  # token-mean has no constant
    with pytest.raises(ValueError) as e:
        aggregate_loss(X, M, "mean")
    for name in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                 "seq-mean-token-sum-norm"):
        assert name in str(e.value)
    with pytest.raises(ValueError, match="num_tokens"):
        aggregate_loss(X, M, "token-mean", num_tokens=0)
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(X, M[:, :5], "token-mean")
    assert set(LOSS_AGGREGATIONS.names()) == {"token-mean", "seq-mean-token-mean",
                                              "seq-mean-token-sum", "seq-mean-token-sum-norm"}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                                  "seq-mean-token-sum-norm"])
def test_microbatch_gradients_match_full_batch(mode):
    g = torch.Generator().manual_seed(0)
    B, T = 8, 10
    base = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([10, 3, 7, 1, 0, 5, 9, 2])  # unequal lengths, one empty row
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()
    kw = {"constant": 10.0} if mode == "seq-mean-token-sum-norm" else {}

    full = base.clone().requires_grad_()
    full_val = aggregate_loss(full.square(), mask, mode, **kw)
    full_val.backward()

    acc = base.clone().requires_grad_()
    norms = aggregation_normalizers(mask)
    assert norms == {"num_tokens": 37, "num_seqs": 7, "num_rows": 8}
    total = 0.0
    for rows in torch.arange(B).chunk(4):
        part = aggregate_loss(acc[rows].square(), mask[rows], mode, **kw, **norms)
        part.backward()  # gradients accumulate into acc.grad
        total += float(part.detach())
    assert total == pytest.approx(float(full_val.detach()), rel=1e-12)
    assert torch.allclose(full.grad, acc.grad)

    # sanity: local normalisers do NOT reproduce the full batch for these lengths
    naive = sum(float(aggregate_loss(base[rows].square(), mask[rows], mode, **kw))
                for rows in torch.arange(B).chunk(4))
    assert naive != pytest.approx(float(full_val.detach()), rel=1e-6)
