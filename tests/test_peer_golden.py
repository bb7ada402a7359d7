"""Golden tests of the peer tables in docs/knobs.md ("Against the peers, variant by variant"),
advantage estimators (the policy losses, aggregations, KL estimators and rollout corrections are in
tests/test_peer_golden_losses.py): for each row that says "same with `<knobs>`", the peer's formula
written out here from the code read (file, function and commit named in each docstring; no peer
package is imported), fed inputs that separate the conventions (near-constant groups, constant
groups, one-hot groups, unequal lengths, KL in the token rewards), and the harness with those knobs
equals it to 1e-12 in float64. Each test also shows that the knob is on: without it the harness
differs.

Commits read: TRL f2cd577 (2026-07-24), verl b178a3c (2026-01-29), OpenRLHF 3c3be62 (2026-08-13),
NeMo-RL 7ea279a (2026-08-22).
"""

from __future__ import annotations

import numpy as np
import torch

from harness.algo import GROUP_FILTERS, AdvantageContext, compute_advantages, estimate_advantages

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)


# Four groups of G = 5: spread rewards, a near-constant group (0.95 + 1e-4 z, the inputs on
# which an eps or a variance floor decides the scale), a constant group, a one-hot group.
Z = torch.tensor([0.3, -1.2, 0.8, 0.1, 0.0], dtype=F64)
REWARDS = torch.stack([
    torch.tensor([0.0, 1.0, 1.0, 0.5, 0.2], dtype=F64),
    0.95 + 1e-4 * Z,
    torch.full((5,), 0.7, dtype=F64),
    torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0], dtype=F64),
])

# A token batch: 4 rows, unequal lengths, one fully masked row (an empty / masked completion).
LENGTHS = [3, 1, 0, 5]
MASK = (torch.arange(5)[None] < torch.tensor(LENGTHS)[:, None]).to(F64)


def _std(x: torch.Tensor, bessel: bool) -> torch.Tensor:
    """Std along the last axis from the deviations (torch.std with/without Bessel's correction)."""
    n = x.shape[-1]
    dev = x - x.mean(-1, keepdim=True)
    return (dev.square().sum(-1, keepdim=True) / (n - 1 if bessel else n)).sqrt()



# ----------------------------------------------------------------- advantage estimators


def test_trl_grpo_trainer_scale_rewards_group_advantages():
    """TRL f2cd577, `trl/trainer/grpo_trainer.py` `GRPOTrainer._generate_and_score_completions`,
    `scale_rewards="group"`: `(r - nanmean_g) / (nanstd_g + 1e-4)`, `nanstd` Bessel-corrected
    (`trl/trainer/utils.py` `nanstd`). Harness: `advantage=grpo advantage.eps=1e-4`."""
    trl = (REWARDS - REWARDS.mean(-1, keepdim=True)) / (_std(REWARDS, bessel=True) + 1e-4)
    ours = compute_advantages(REWARDS, "grpo", eps=1e-4)
    torch.testing.assert_close(ours, trl, **TOL)
    # the knob is on: the default eps 1e-6 scales the near-constant group ~1.6x larger
    assert abs(float(compute_advantages(REWARDS, "grpo")[1, 1] / trl[1, 1]) - 1) > 0.5


def test_trl_grpo_trainer_scale_rewards_batch_advantages():
    """The same TRL function (f2cd577, `trl/trainer/grpo_trainer.py`
    `GRPOTrainer._generate_and_score_completions`), `scale_rewards="batch"`: the group mean is subtracted and the result
    divided by `nanstd` of every reward of the batch (Bessel) + 1e-4. Harness:
    `advantage=grpo advantage.scale=batch advantage.eps=1e-4`."""
    batch_std = _std(REWARDS.reshape(1, -1), bessel=True)
    trl = (REWARDS - REWARDS.mean(-1, keepdim=True)) / (batch_std + 1e-4)
    ours = compute_advantages(REWARDS, "grpo", scale="batch", eps=1e-4)
    torch.testing.assert_close(ours, trl, **TOL)
    assert not torch.allclose(compute_advantages(REWARDS, "grpo", eps=1e-4), trl)


def test_openrlhf_experience_maker_group_norm_advantages():
    """OpenRLHF 3c3be62, `openrlhf/trainer/ppo_utils/experience_maker.py`
    `compute_advantages_and_returns`, estimator `group_norm`:
    `(r - r.mean(-1)) / (r.std(-1) + 1e-9)` (torch.std: Bessel). With gamma 1 and no KL in the
    reward, every token of a row carries that value. Harness: `advantage=grpo advantage.eps=1e-9`."""
    openrlhf = (REWARDS - REWARDS.mean(-1, keepdim=True)) / (_std(REWARDS, bessel=True) + 1e-9)
    ours = compute_advantages(REWARDS, "grpo", eps=1e-9)
    torch.testing.assert_close(ours, openrlhf, **TOL)
    assert abs(float(compute_advantages(REWARDS, "grpo")[1, 1] / openrlhf[1, 1]) - 1) > 1e-3


def _nemo_rl_grpo(r: torch.Tensor, bessel: bool, eps: float) -> torch.Tensor:
    """NeMo-RL `GRPOAdvantageEstimator.compute_advantage` with `use_leave_one_out_baseline=false`,
    `normalize_rewards=true`: baseline and std from `calculate_baseline_and_std_per_prompt`
    (`E[r^2] - E[r]^2`, times `n/(n-1)` since PR #1423), `(r - b) / (std + eps)` only where
    `std > 0`, `r - b` elsewhere."""
    n = r.shape[-1]
    b = r.mean(-1, keepdim=True)
    var = r.square().mean(-1, keepdim=True) - b.square()
    if bessel:
        var = var * (n / (n - 1))
    std = var.clamp(min=0).sqrt()
    return torch.where(std > 0, (r - b) / (std + eps), r - b)


def test_nemo_rl_grpo_advantage_estimator_before_pr_1423():
    """NeMo-RL `nemo_rl/algorithms/advantage_estimator.py` `GRPOAdvantageEstimator` before PR
    #1423 (2025-11-13; `nemo_rl/algorithms/utils.py` read at the PR's parent, `7124e44^`): the
    population std of the group, `sqrt(E[r^2] - E[r]^2)`, no eps, unscaled where it is 0. Harness:
    `advantage=grpo advantage.unbiased=false advantage.eps=0`. Since the PR (Bessel, + 1e-6, read
    at 7ea279a) it is `advantage=grpo` as it stands, checked here too."""
    # the constant group is exactly 0 on both sides; NeMo-RL's E[r^2] - E[r]^2 of the
    # near-constant group keeps ~1e-9 of relative error, so that group is compared apart
    spread = REWARDS[[0, 2, 3]]
    before = _nemo_rl_grpo(spread, bessel=False, eps=0.0)
    torch.testing.assert_close(compute_advantages(spread, "grpo", unbiased=False, eps=0.0), before, **TOL)
    since = _nemo_rl_grpo(spread, bessel=True, eps=1e-6)
    torch.testing.assert_close(compute_advantages(spread, "grpo"), since, **TOL)
    assert not torch.allclose(compute_advantages(spread, "grpo"), before)
    near = REWARDS[1:2]
    torch.testing.assert_close(compute_advantages(near, "grpo"), _nemo_rl_grpo(near, True, 1e-6),
                               rtol=1e-7, atol=0)


def test_verl_compute_gpg_outcome_advantage():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py`
    `compute_gpg_outcome_advantage` (`f_norm` 1): `alpha = B / count_nonzero(r)`
    over the batch, `A = alpha (r - mean_g)`. Harness: `advantage=gpg advantage.alpha=nonzero`
    (the paper's `alpha = B / (B - M)` is the default)."""
    r = REWARDS.clone()
    r[0, 3] = 0.0  # 14 non-zero rewards of 20, 15 in varied groups: the two alphas differ
    alpha = r.numel() / int((r != 0).sum())
    verl = alpha * (r - r.mean(-1, keepdim=True))
    torch.testing.assert_close(compute_advantages(r, "gpg", alpha="nonzero"), verl, **TOL)
    assert not torch.allclose(compute_advantages(r, "gpg"), verl)


def _verl_masked_whiten(x: torch.Tensor, mask: torch.Tensor, count_eps: float = 1e-8) -> torch.Tensor:
    """verl b178a3c, `verl/utils/torch_functional.py` `masked_whiten`: masked mean, Bessel-corrected
    masked variance, `(x - mean) rsqrt(var + 1e-8)`. With the default `count_eps` it is verbatim:
    verl's `masked_mean` divides by `sum(mask) + 1e-8`, for the mean and for the variance. With
    `count_eps=0`, the exact masked mean the harness takes (verl's `masked_var` refuses an empty
    mask, so the 1e-8 guards nothing there and only nudges the result)."""
    n = mask.sum()
    mean = (x * mask).sum() / (n + count_eps)
    var = ((x - mean).square() * mask).sum() / (n + count_eps) * (n / (n - 1))
    return (x - mean) * torch.rsqrt(var + 1e-8)


def test_verl_compute_gae_advantage_return_lam_1():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py` `compute_gae_advantage_return`: the backward GAE loop
    (`delta = r_t + gamma V_{t+1} - V_t`, masked positions skipped) with verl's default
    `lam=1.0`, then `verl_F.masked_whiten` (Bessel-corrected variance, `rsqrt(var + 1e-8)`).
    Harness: `advantage=ppo advantage.lam=1.0` (gamma 1.0, whiten, unbiased as defaults), to 1e-12
    against `masked_whiten` without the `+ 1e-8` in `masked_mean`'s count; verbatim verl, with it,
    lies 1.6e-9 away on these 9 tokens (measured, asserted)."""
    mask = MASK[[0, 1, 3]]
    lengths = [3, 1, 5]
    token_rewards = torch.zeros(3, 5, dtype=F64)
    for b, (L, r) in enumerate(zip(lengths, [1.0, 0.0, 0.5])):
        token_rewards[b, L - 1] = r
    values = torch.tensor([[0.2, 0.4, 0.1, 9.0, 9.0], [0.3, 9.0, 9.0, 9.0, 9.0],
                           [0.5, -0.2, 0.6, 0.0, 0.35]], dtype=F64)
    gamma, lam = 1.0, 1.0
    next_v = torch.zeros(3, dtype=F64)
    last = torch.zeros(3, dtype=F64)
    rev = []
    for t in reversed(range(5)):
        delta = token_rewards[:, t] + gamma * next_v - values[:, t]
        new_last = delta + gamma * lam * last
        next_v = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_v
        last = new_last * mask[:, t] + (1 - mask[:, t]) * last
        rev.append(last)
    adv = torch.stack(rev[::-1], 1)
    verl = _verl_masked_whiten(adv, mask, count_eps=0.0) * mask
    ctx = AdvantageContext(scores=torch.tensor([[1.0, 0.0, 0.5]], dtype=F64), token_rewards=token_rewards,
                           mask=mask, values=values)
    ours = estimate_advantages("ppo", ctx, lam=1.0).advantages
    torch.testing.assert_close(ours * mask, verl, **TOL)
    assert not torch.allclose(estimate_advantages("ppo", ctx).advantages * mask, verl)
    assert 1.5e-9 < (_verl_masked_whiten(adv, mask) * mask - verl).abs().max() < 1.7e-9  # the count's 1e-8


# ----------------------------------------------------------------- verl outcome estimators, KL placement


# Two groups of G = 3, unequal lengths (no empty row: verl's rows all carry a score).
LENGTHS_V = [3, 1, 5, 2, 4, 5]
MASK_V = (torch.arange(5)[None] < torch.tensor(LENGTHS_V)[:, None]).to(F64)
SCORES_V = torch.tensor([[1.0, 0.0, 0.5], [0.2, 0.9, 0.9]], dtype=F64)
KL_V = torch.linspace(0.01, 0.3, 30, dtype=F64).reshape(6, 5) * MASK_V  # beta * per-token KL


def _outcome_token_rewards(scores: torch.Tensor) -> torch.Tensor:
    """Each row's score at its last valid token (verl's `token_level_rewards` without KL)."""
    tr = torch.zeros(6, 5, dtype=F64)
    for b, L in enumerate(LENGTHS_V):
        tr[b, L - 1] = scores.flatten()[b]
    return tr


def test_verl_compute_reinforce_plus_plus_baseline_outcome_advantage():
    """verl `verl/trainer/ppo/core_algos.py` `compute_reinforce_plus_plus_baseline_outcome_advantage`
    (b178a3c): `score = token_level_rewards.sum(-1)`, minus its group mean, broadcast to every valid
    token, then `masked_whiten` over the batch. Harness: `advantage=reinforce_pp_baseline` with
    `kl.placement=loss` or `none` (the token rewards are the outcome alone), to 1e-12 against
    `masked_whiten` without the `+ 1e-8` in `masked_mean`'s count; verbatim verl, with it, lies
    5.1e-10 away on these 20 tokens (measured, asserted). With
    `kl.placement=reward` (per-token KL in the token rewards) verl broadcasts the row sum, ours
    takes the return-to-go: they differ, checked here."""
    def verl(token_rewards, count_eps):
        s = token_rewards.sum(-1).reshape(2, 3)
        s = (s - s.mean(-1, keepdim=True)).reshape(6, 1)
        return _verl_masked_whiten(s.expand(6, 5) * MASK_V, MASK_V, count_eps) * MASK_V

    tr = _outcome_token_rewards(SCORES_V)
    ctx = AdvantageContext(scores=SCORES_V, token_rewards=tr, mask=MASK_V)
    ours = estimate_advantages("reinforce_pp_baseline", ctx).advantages * MASK_V
    torch.testing.assert_close(ours, verl(tr, 0.0), **TOL)
    assert 5e-10 < (verl(tr, 1e-8) - verl(tr, 0.0)).abs().max() < 5.2e-10  # the count's 1e-8
    tr_kl = tr - KL_V
    ctx_kl = AdvantageContext(scores=tr_kl.sum(-1).reshape(2, 3), token_rewards=tr_kl, mask=MASK_V)
    ours_kl = estimate_advantages("reinforce_pp_baseline", ctx_kl).advantages * MASK_V
    assert not torch.allclose(ours_kl, verl(tr_kl, 0.0))


def test_verl_compute_remax_outcome_advantage():
    """verl `verl/trainer/ppo/core_algos.py` `compute_remax_outcome_advantage` (b178a3c): the
    reward-to-go `(token_level_rewards * mask).flip.cumsum.flip` minus the greedy completion's
    reward on every valid token. Harness: `advantage=remax` with `kl.placement=loss` or `none`.
    With `kl.placement=reward` verl's token `t` gets `r - sum_{s>=t} KL_s - r_greedy`, ours
    `r - sum_t KL_t - r_greedy`: they differ, checked here."""
    greedy = torch.tensor([0.4, 0.7], dtype=F64)

    def verl(token_rewards):
        returns = (token_rewards * MASK_V).flip(-1).cumsum(-1).flip(-1)
        return returns - greedy.repeat_interleave(3)[:, None] * MASK_V

    tr = _outcome_token_rewards(SCORES_V)
    ctx = AdvantageContext(scores=SCORES_V, token_rewards=tr, mask=MASK_V, greedy_scores=greedy)
    torch.testing.assert_close(estimate_advantages("remax", ctx).advantages * MASK_V, verl(tr), **TOL)
    tr_kl = tr - KL_V
    ctx_kl = AdvantageContext(scores=tr_kl.sum(-1).reshape(2, 3), token_rewards=tr_kl, mask=MASK_V,
                              greedy_scores=greedy)
    assert not torch.allclose(estimate_advantages("remax", ctx_kl).advantages * MASK_V, verl(tr_kl))


# ----------------------------------------------------------------- group filter


def test_verl_recipe_dapo_ray_trainer_filter_groups_keep_rule():
    """verl-recipe 21892b9 (the `recipe/` submodule of verl b178a3c), `dapo/dapo_ray_trainer.py`
    `RayDAPOTrainer.fit`, `algorithm.filter_groups.enable`: a prompt's group is kept where
    `np.std(metric_vals) > 0 or len(metric_vals) == 1`. Harness: `group_filter=dapo` keeps the
    same groups of 2 or more members, float32 rewards as the trainer's (numpy's std of a constant
    group is 0; a float32 `torch.std` of one group of eight 0.1s is 8e-9). The refill and the group of one
    differ (docs/knobs.md)."""
    rewards = torch.stack([
        torch.full((8,), 0.1),  # eight formatted wrong answers (task.format_reward=0.1)
        torch.full((8,), 0.7),
        torch.tensor([1.1] * 7 + [0.1]),
        (0.95 + 1e-4 * torch.linspace(-1, 1, 8)),
        torch.full((8,), 1.0),
    ]).to(torch.float32)
    verl = torch.tensor([bool(np.std(row.numpy()) > 0) for row in rewards])
    spec = GROUP_FILTERS.spec("dapo")
    assert spec.fn(rewards, spec.build()).tolist() == verl.tolist() == [False, False, True, True, False]
    # one group at a time, as a refill round that needs one group (or one prompt per rank) filters
    one_by_one = [bool(spec.fn(row[None], spec.build())) for row in rewards]
    assert one_by_one == verl.tolist()
    assert bool(rewards[:1].std(dim=1) > 0)  # there the std > 0 reading keeps the constant 0.1 group
