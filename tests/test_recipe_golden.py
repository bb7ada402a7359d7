"""Golden values: on one fixed batch, each recipe's advantages and loss equal the convention it
claims to reproduce, written out by hand here from the peer's published code (not from ours).

The harness side is the trainer's own path: the recipe's :class:`harness.algo.Algorithm` through
``shape_rewards`` -> its estimator -> ``token_objective`` + ``aggregate`` with the whole-batch normalisers.
The batch has unequal lengths, ratios on both sides of every clip bound, negative advantages
with large ratios (dual-clip) and one token whose k3 exceeds 10 (the KL clamp).
"""

from __future__ import annotations

import math

import pytest
import torch

from harness.algo import AdvantageContext, build_algorithm
from harness.algo.aggregation import aggregation_normalizers
from harness.train.rewards import shape_rewards
from harness.train.update import aggregate, token_objective
from tests.conftest import compose

G = 4
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.0, 0.0, 1.0, 1.0])
LENGTHS = [3, 1, 4, 2, 4, 4, 2, 1]
T = 4
MAX_NEW = 6
MASK = (torch.arange(T)[None] < torch.tensor(LENGTHS)[:, None]).float()
g = torch.Generator().manual_seed(0)
LOGP = -torch.rand(8, T, generator=g) * 2 - 0.1
# old log-probs: ratios exp(logp - old) spread over [0.5, 1.6]
OLD = LOGP - torch.linspace(-0.7, 0.47, 8 * T).reshape(8, T)
REF = LOGP - 0.3 * torch.rand(8, T, generator=g)
REF[0, 0] = LOGP[0, 0] + 3.0  # k3 = e^3 - 3 - 1 = 16.1 > 10


def harness_side(recipe, rewards=REWARDS):
    cfg = compose(f"recipe={recipe}", f"group_size={G}", f"rollout.max_new_tokens={MAX_NEW}")
    algo = build_algorithm(cfg)
    ref = REF if cfg.beta > 0 else None
    scores, token_rewards = shape_rewards(rewards, MASK, OLD, ref, algo.kl)
    ctx = AdvantageContext(scores=scores.view(-1, G), token_rewards=token_rewards, mask=MASK)
    adv = algo.estimator(ctx).advantages
    logp = LOGP.clone().requires_grad_()
    per_token, _ = token_objective(logp, OLD, ref, adv, MASK, torch.zeros_like(LOGP), algo)
    loss = aggregate(per_token, MASK, algo, aggregation_normalizers(MASK))
    return cfg, adv, float(loss)


def group_z(eps):
    """(r - mean_group) / (std_group + eps), std Bessel-corrected (torch.std), per group of G."""
    out = []
    for p in range(len(REWARDS) // G):
        grp = REWARDS[p * G:(p + 1) * G].tolist()
        mean = sum(grp) / G
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (G - 1))
        out += [(x - mean) / (std + eps) for x in grp]
    return out


def ppo_clip_token(ratio, a, lo, hi):
    return max(-a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi))


def k3_clamped(logp, ref, clamp):
    log_r = max(min(ref - logp, 20.0), -20.0)
    return max(min(math.exp(log_r) - log_r - 1, clamp), -clamp)


def tokens():
    for b in range(8):
        for t in range(LENGTHS[b]):
            yield b, t, math.exp(float(LOGP[b, t] - OLD[b, t]))


def test_batch_reaches_every_branch():
    ratios = [r for _, _, r in tokens()]
    assert min(ratios) < 0.8 and max(ratios) > 1.28 and any(1.2 < r < 1.28 for r in ratios)
    assert any(r > 3.0 for r in ratios) or any(REWARDS.view(-1, G).std(1) > 0)
    assert k3_clamped(float(LOGP[0, 0]), float(REF[0, 0]), 1e9) > 10


def test_trl_grpo():
    """TRL GRPOTrainer: A = (r - mean) / (std + 1e-4); loss_type="dapo": sum of the clipped
    per-token losses over the batch / number of completion tokens; beta = 0."""
    cfg, adv, loss = harness_side("trl_grpo")
    a = group_z(1e-4)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    want = sum(ppo_clip_token(r, a[b], 0.2, 0.2) for b, t, r in tokens()) / sum(LENGTHS)
    assert loss == pytest.approx(want, rel=1e-6)


def test_dr_grpo():
    """Dr. GRPO: A = r - mean (no std); loss = (1/G) sum_i (1/L_max) sum_t l_it over the batch's
    sequences, L_max the generation cap."""
    cfg, adv, loss = harness_side("dr_grpo")
    r = REWARDS.tolist()
    a = [r[i] - sum(r[(i // G) * G:(i // G + 1) * G]) / G for i in range(len(r))]
    assert adv[:, 0].tolist() == pytest.approx(a, abs=1e-7)
    want = sum(ppo_clip_token(r, a[b], 0.2, 0.2) for b, t, r in tokens()) / MAX_NEW / 8
    assert loss == pytest.approx(want, rel=1e-6)


def test_dapo():
    """DAPO: GRPO advantages (eps 1e-6), clip-higher 0.2 / 0.28, token-level mean, no KL."""
    cfg, adv, loss = harness_side("dapo")
    a = group_z(1e-6)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    want = sum(ppo_clip_token(r, a[b], 0.2, 0.28) for b, t, r in tokens()) / sum(LENGTHS)
    assert loss == pytest.approx(want, rel=1e-6)
    plain = sum(ppo_clip_token(r, a[b], 0.2, 0.2) for b, t, r in tokens()) / sum(LENGTHS)
    assert abs(loss - plain) > 1e-4  # clip-higher bites on this batch


def test_verl_grpo():
    """verl compute_policy_loss_vanilla with clip_ratio_c=3 (dual-clip for A < 0), plus
    kl_loss_coef 0.001 x low_var_kl clamped to [-10, 10], both token-mean."""
    cfg, adv, loss = harness_side("verl_grpo")
    a = group_z(1e-6)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)

    def pg(r, x):
        l1 = ppo_clip_token(r, x, 0.2, 0.2)
        return min(-x * 3.0, l1) if x < 0 else l1

    n = sum(LENGTHS)
    pg_loss = sum(pg(r, a[b]) for b, t, r in tokens()) / n
    kl = sum(k3_clamped(float(LOGP[b, t]), float(REF[b, t]), 10.0) for b, t, _ in tokens()) / n
    assert loss == pytest.approx(pg_loss + 0.001 * kl, rel=1e-6)


def test_openrlhf_group_norm():
    """OpenRLHF group_norm: (r - mean) / (std + 1e-9); PolicyLoss token-level; k3 KL loss
    0.001, every estimator clamped to [-10, 10]."""
    cfg, adv, loss = harness_side("openrlhf_group_norm")
    a = group_z(1e-9)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    n = sum(LENGTHS)
    pg_loss = sum(ppo_clip_token(r, a[b], 0.2, 0.2) for b, t, r in tokens()) / n
    kl = sum(k3_clamped(float(LOGP[b, t]), float(REF[b, t]), 10.0) for b, t, _ in tokens()) / n
    assert loss == pytest.approx(pg_loss + 0.001 * kl, rel=1e-6)


def test_cs336_grpo():
    """CS336 assignment 5: masked_mean over each response, then the mean over the batch."""
    cfg, adv, loss = harness_side("cs336_grpo")
    a = group_z(1e-6)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    per_seq = [0.0] * 8
    for b, t, r in tokens():
        per_seq[b] += ppo_clip_token(r, a[b], 0.2, 0.2) / LENGTHS[b]
    assert loss == pytest.approx(sum(per_seq) / 8, rel=1e-6)


def test_gspo():
    """GSPO: s_i = exp(mean_t log(pi/pi_old)) clipped to [1 - 3e-4, 1 + 4e-4]; the loss is the
    mean over sequences of -min(s_i A_i, clip(s_i) A_i) (the paper's 1/G), no KL."""
    cfg, adv, loss = harness_side("gspo")
    a = group_z(1e-6)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    per_seq = []
    for b in range(8):
        s = math.exp(sum(float(LOGP[b, t] - OLD[b, t]) for t in range(LENGTHS[b])) / LENGTHS[b])
        per_seq.append(max(-a[b] * s, -a[b] * min(max(s, 1 - 3e-4), 1 + 4e-4)))
    assert loss == pytest.approx(sum(per_seq) / 8, rel=1e-6)


def test_luspo():
    """LUSPO (TRL loss_type="luspo"): GSPO's sequence ratio clipped to [1 - 2e-3, 1 + 2.5e-3], each
    sequence's value -min(s_i A_i, clip(s_i) A_i) times its length |y_i|, then the mean over
    sequences ((per_token_loss * mask.sum(1)).mean()); no KL."""
    cfg, adv, loss = harness_side("luspo")
    a = group_z(1e-6)
    assert adv[:, 0].tolist() == pytest.approx(a, rel=1e-6)
    per_seq = []
    for b in range(8):
        s = math.exp(sum(float(LOGP[b, t] - OLD[b, t]) for t in range(LENGTHS[b])) / LENGTHS[b])
        per_seq.append(LENGTHS[b] * max(-a[b] * s, -a[b] * min(max(s, 1 - 2e-3), 1 + 2.5e-3)))
    assert loss == pytest.approx(sum(per_seq) / 8, rel=1e-6)
    _, _, gspo_loss = harness_side("gspo")
    assert abs(loss - gspo_loss) > 0.1  # the length scaling acts


def test_gpg():
    """GPG (AMAP-ML/GPG open-r1 gpg_trainer.py): A = r - mean (scale_rewards False), loss
    -A log pi summed over the batch's completion tokens / their count, divided by inverse_alpha
    = the fraction of groups whose rewards vary (adjust_gd); no KL. The second group here is
    constant, so inverse_alpha = 1/2."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5, 1.0, 1.0, 1.0, 1.0])
    cfg, adv, loss = harness_side("gpg", rewards)
    r = rewards.tolist()
    centred = [r[i] - sum(r[(i // G) * G:(i // G + 1) * G]) / G for i in range(len(r))]
    inverse_alpha = 1 / 2
    assert adv[:, 0].tolist() == pytest.approx([c / inverse_alpha for c in centred], abs=1e-7)
    token_loss = sum(-centred[b] * float(LOGP[b, t]) for b, t, _ in tokens()) / sum(LENGTHS)
    assert loss == pytest.approx(token_loss / inverse_alpha, rel=1e-6)
