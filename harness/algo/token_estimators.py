"""Token-level advantage estimators: ``fn(ctx: AdvantageContext, p) -> AdvantageOutput``.

Registered in the one estimator registry (:mod:`harness.algo.estimators`, ``TOKEN_ESTIMATORS``)
with their params dataclass (the Hydra schema of ``advantage=<name>``) and the extra inputs
they ``needs``: ``reinforce_pp``, ``reinforce_pp_baseline``, ``ppo``, ``remax``, ``opo``, ``gdpo``
and ``process``. The outcome estimators (``grpo``, ``rloo``, ...) live in :mod:`.advantages` and
:mod:`.rescaled`. Each receives the context :class:`harness.algo.estimators.Estimator` checked,
packed and cast to float64, and checks only its own params and inputs.

Layout: ``P`` prompts x ``G`` completions, ``B = P * G`` rows in group-major
order (row ``b = p * G + g``), ``T`` padded completion length, right padding.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from .estimators import TOKEN_ESTIMATORS, AdvantageContext, AdvantageOutput, broadcast, float_mask
from .gae import gae, reinforce_pp_returns
from .utils import masked_mean, masked_var, masked_whiten, right_padded_lengths


# --------------------------------------------------------------------------- REINFORCE++


@dataclass
class ReinforcePPParams:
    """``advantage=reinforce_pp``: REINFORCE++ (Hu 2025)."""

    name: str = "reinforce_pp"
    gamma: float = 1.0  # discount of the return-to-go
    unbiased: bool = True  # whitening variance: Bessel-corrected (verl) or population (OpenRLHF)


@dataclass
class ReinforcePPBaselineParams:
    """``advantage=reinforce_pp_baseline``: REINFORCE++-baseline (Hu 2025; OpenRLHF reinforce_baseline)."""

    name: str = "reinforce_pp_baseline"
    gamma: float = 1.0
    unbiased: bool = True


@TOKEN_ESTIMATORS.register("reinforce_pp", params=ReinforcePPParams, grouped=False,
                           invariances=("permutation", "shift", "scale"))
def reinforce_pp(ctx: AdvantageContext, p: ReinforcePPParams) -> AdvantageOutput:
    """REINFORCE++ advantage: batch-whitened discounted return-to-go.

    Shapes: ``ctx.token_rewards``, ``ctx.mask`` ``[B, T]`` -> advantages ``[B, T]``.

    Formula (Hu 2025, "REINFORCE++", arXiv 2501.03262, sec. 3;
    OpenRLHF ``reinforce``): ``G_t = sum_{s >= t} gamma^(s-t) r_s`` over the
    row's valid tokens, then ``A = (G - mean) / sqrt(var + 1e-8)`` with mean and
    variance over all valid tokens of the batch: Bessel-corrected when ``p.unbiased``
    (verl ``masked_whiten``), the population variance otherwise (OpenRLHF
    ``masked_normalize``, which clamps ``var`` at 1e-8 instead of adding it).

    Raises:
        ValueError: context shape errors or ``gamma`` outside ``[0, 1]``.
    """
    m = float_mask(ctx)
    returns = reinforce_pp_returns(ctx.token_rewards, ctx.mask, gamma=p.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, m, unbiased=p.unbiased))


@TOKEN_ESTIMATORS.register("reinforce_pp_baseline", params=ReinforcePPBaselineParams, grouped=True,
                           invariances=("permutation", "shift", "scale"))
def reinforce_pp_baseline(ctx: AdvantageContext, p: ReinforcePPBaselineParams) -> AdvantageOutput:
    """REINFORCE++-baseline: group-mean baseline, return-to-go, batch whitening.

    Shapes: ``ctx.scores`` ``[P, G]``, ``ctx.token_rewards``/``ctx.mask``
    ``[B, T]`` -> advantages ``[B, T]``.

    Formula (Hu 2025, arXiv 2501.03262, REINFORCE++-baseline; OpenRLHF
    ``reinforce_baseline``): ``b_p`` = mean of ``scores`` over the valid members
    of group ``p``; ``r'`` = ``token_rewards`` with ``b_p`` subtracted at each
    row's last valid token; ``G_t`` = return-to-go of ``r'`` with ``gamma``;
    ``A`` = ``G`` whitened over all valid tokens of the batch (variance as
    :func:`reinforce_pp`). With ``gamma=1``, ``G_0 = score - b_p``.

    Raises:
        ValueError: context shape errors, ``G < 2``, ``gamma`` outside ``[0, 1]``.
    """
    P, G = ctx.scores.shape
    m = float_mask(ctx)
    lengths = right_padded_lengths(ctx.mask)
    valid = (lengths > 0).reshape(P, G)
    baseline = masked_mean(ctx.scores.to(m.dtype), valid, dim=-1, keepdim=True)  # [P, 1]
    baseline = baseline.expand(P, G).reshape(-1)  # [B]
    last = (lengths - 1).clamp(min=0)
    rows = torch.arange(m.shape[0], device=m.device)
    shaped = ctx.token_rewards.to(m.dtype).clone()
    shaped[rows, last] -= torch.where(lengths > 0, baseline, torch.zeros_like(baseline))
    returns = reinforce_pp_returns(shaped, ctx.mask, gamma=p.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, m, unbiased=p.unbiased))


# --------------------------------------------------------------------------- PPO


@dataclass
class PPOParams:
    """``advantage=ppo``: GAE with a learned critic (``critic.*``, harness/train/critic.py). gamma=1:
    rewards are episodic and undiscounted (the outcome reward sits on the last token); lam=0.95
    as in the GAE paper and verl/OpenRLHF."""

    name: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True  # whiten advantages over the batch's valid tokens
    unbiased: bool = True  # whitening variance: Bessel-corrected (verl) or population (OpenRLHF)


@TOKEN_ESTIMATORS.register("ppo", params=PPOParams, grouped=False, needs=("values",), invariances=("permutation",))
def ppo(ctx: AdvantageContext, p: PPOParams) -> AdvantageOutput:
    """PPO advantages from GAE with a critic.

    Shapes: ``ctx.token_rewards``, ``ctx.values``, ``ctx.mask`` ``[B, T]`` ->
    ``advantages`` and ``returns`` ``[B, T]``.

    Formula: :func:`harness.algo.gae.gae` (Schulman et al. 2016) with
    ``p.gamma``/``p.lam``; ``returns = A + V`` computed *before* whitening; if
    ``p.whiten`` the advantages are whitened over all valid tokens of the batch
    (Ouyang et al. 2022 / verl ``gae`` convention; variance as :func:`reinforce_pp`).

    Raises:
        ValueError: ``ctx.values`` is None or mis-shaped; context shape errors;
            ``gamma``/``lam`` outside ``[0, 1]``.
    """
    if ctx.values is None:
        raise ValueError("ctx.values must be a [B, T] tensor of critic values for estimator 'ppo'")
    adv, returns = gae(ctx.token_rewards, ctx.values, ctx.mask, gamma=p.gamma, lam=p.lam)
    if p.whiten:
        adv = masked_whiten(adv, float_mask(ctx), unbiased=p.unbiased)
    return AdvantageOutput(advantages=adv, returns=returns)


# --------------------------------------------------------------------------- ReMax, OPO


@dataclass
class ReMaxParams:
    """``advantage=remax``: ReMax (Li et al. 2023), the greedy completion's reward as baseline."""

    name: str = "remax"


@TOKEN_ESTIMATORS.register("remax", params=ReMaxParams, grouped=False, needs=("greedy",),
                           invariances=("permutation", "shift", "scale_equivariant"))
def remax(ctx: AdvantageContext, p: ReMaxParams) -> AdvantageOutput:
    """ReMax advantage: ``A_pg = r_pg - r_greedy(p)`` on every valid token.

    Shapes: ``ctx.scores`` ``[P, G]``, ``ctx.greedy_scores`` ``[P]`` -> ``[B, T]``.

    Formula (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
    Method for Aligning LLMs", Alg. 1; verl ``remax``): the baseline is the reward of one greedy
    (temperature 0) completion of the same prompt, generated and scored by the trainer each step
    (``needs=("greedy",)``). Works with ``group_size=1``.

    Raises:
        ValueError: ``ctx.greedy_scores`` missing or not ``[P]``; context shape errors.
    """
    P, G = ctx.scores.shape
    if ctx.greedy_scores is None or tuple(ctx.greedy_scores.shape) != (P,):
        raise ValueError(f"ctx.greedy_scores must be a [P]=[{P}] tensor of greedy rewards for estimator 'remax'")
    m = float_mask(ctx)
    seq = ctx.scores.to(m.dtype) - ctx.greedy_scores.to(m.dtype).unsqueeze(-1)
    valid = (ctx.mask.to(torch.bool).sum(-1) > 0).reshape(P, G)
    return AdvantageOutput(advantages=broadcast(torch.where(valid, seq, torch.zeros_like(seq)), m))


@dataclass
class OPOParams:
    """``advantage=opo``: on-policy RL with the optimal reward baseline (Hao et al. 2025)."""

    name: str = "opo"


@TOKEN_ESTIMATORS.register("opo", params=OPOParams, grouped=True,
                           invariances=("permutation", "shift", "scale_equivariant", "constant_zero"))
def opo(ctx: AdvantageContext, p: OPOParams) -> AdvantageOutput:
    """OPO advantage: ``A_i = r_i - b``, ``b = sum_j L_j r_j / sum_j L_j`` over the group.

    Shapes: ``ctx.scores`` ``[P, G]``, ``ctx.mask`` ``[B, T]`` -> ``[B, T]``.

    Formula (Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline", eq. 5: the
    variance-minimising baseline under the sequence-level gradient, with the gradient norm
    approximated by the length ``L_j``; verl ``opo``). Rows with no valid token are excluded.
    A group whose rewards are all equal gets 0.

    Raises:
        ValueError: context shape errors, ``G < 2``.
    """
    P, G = ctx.scores.shape
    m = float_mask(ctx)
    lengths = m.sum(-1).reshape(P, G)
    r = ctx.scores.to(m.dtype)
    valid = lengths > 0
    b = (lengths * r).sum(-1, keepdim=True) / lengths.sum(-1, keepdim=True).clamp(min=1)
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1, keepdim=True)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1, keepdim=True)
    adv = torch.where(valid & (hi != lo), r - b, torch.zeros_like(r))
    return AdvantageOutput(advantages=broadcast(adv, m))


# --------------------------------------------------------------------------- GDPO


@dataclass
class GDPOParams:
    """``advantage=gdpo``: multi-reward normalise-then-sum (GDPO; TRL ``multi_objective_aggregation``)."""

    name: str = "gdpo"
    eps: float = 1e-4  # added to each std (TRL's 1e-4, both levels)


@TOKEN_ESTIMATORS.register("gdpo", params=GDPOParams, grouped=True, needs=("reward_components",),
                           invariances=("permutation", "shift", "scale"))
def gdpo(ctx: AdvantageContext, p: GDPOParams) -> AdvantageOutput:
    """GDPO advantage: normalise each reward component within its group, sum them with the
    reward's weights, then normalise the sum over the batch.

        z_pgk = (c_pgk - mean_g c_pgk) / (std_g c_pgk + eps)     per component k
        s_pg  = sum_k w_k z_pgk
        A_pg  = (s_pg - mean_{p,g} s) / (std_{p,g} s + eps)

    stds Bessel-corrected, on every token of the row. Source: GDPO (NVIDIA 2026, "Group reward-
    Decoupled Normalization Policy Optimization", arXiv 2601.05242); TRL
    ``multi_objective_aggregation="normalize_then_sum"`` (``GRPOTrainer._generate_and_score_
    completions``, ``nanstd``: Bessel, ``+ 1e-4``). Summing first (GRPO on the total reward,
    TRL's default ``sum_then_normalize``) lets the component with the widest spread in a group
    decide its advantage; normalising first gives each component an equal say.

    The components (``ctx.reward_components`` ``[P, G, K]``, weights ``ctx.reward_weights``
    ``[K]``) are the trainer's: correctness (weight 1), format (``task.format_reward``), the
    DAPO overlong penalty (1), and the rest of the reward shaping (length penalty, a KL placed
    in the reward; 1). A component constant in a group contributes 0 there. Rows with no valid
    token get 0 but, as in TRL, enter the statistics.

    Raises:
        ValueError: missing components or weights of the wrong shape, ``eps < 0``, context shape
            errors, ``G < 2``.
    """
    P, G = ctx.scores.shape
    comp, w = ctx.reward_components, ctx.reward_weights
    if comp is None or comp.dim() != 3 or tuple(comp.shape[:2]) != (P, G):
        got = None if comp is None else tuple(comp.shape)
        raise ValueError(f"ctx.reward_components must be [P, G, K] = [{P}, {G}, K] for estimator 'gdpo', got {got}")
    if w is None or tuple(w.shape) != (comp.shape[2],):
        raise ValueError(f"ctx.reward_weights must be [K] = [{comp.shape[2]}] for estimator 'gdpo', "
                         f"got {None if w is None else tuple(w.shape)}")
    if p.eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {p.eps}")
    m = float_mask(ctx)
    comp = comp.to(m.dtype)
    z = (comp - comp.mean(dim=1, keepdim=True)) / (comp.std(dim=1, keepdim=True) + p.eps)
    s = (z * w.to(m.dtype)).sum(-1)
    std = s.std() if s.numel() > 1 else torch.zeros((), dtype=s.dtype, device=s.device)
    return AdvantageOutput(advantages=broadcast((s - s.mean()) / (std + p.eps), m))


# --------------------------------------------------------------------------- process


@dataclass
class ProcessParams:
    """``advantage=process``: GRPO with process supervision (DeepSeekMath sec. 4.1.3)."""

    name: str = "process"
    eps: float = 1e-6
    unbiased: bool = True


@TOKEN_ESTIMATORS.register("process", params=ProcessParams, grouped=True, needs=("step_rewards",),
                           invariances=("permutation", "shift", "scale", "constant_zero"))
def process(ctx: AdvantageContext, p: ProcessParams) -> AdvantageOutput:
    """GRPO with process supervision (per-step rewards).

    Shapes: ``ctx.scores`` ``[P, G]`` (only its shape is used), ``ctx.mask``
    ``[B, T]``, ``ctx.step_rewards``: B lists of ``(end_index, reward)`` ->
    advantages ``[B, T]``.

    Formula (Shao et al. 2024, DeepSeekMath sec. 4.1.3): all step rewards of
    group ``p`` (every step of every completion in it) are normalised
    ``r~ = (r - mean_p) / (std_p + eps)``, where ``std_p`` is Bessel-corrected
    (``unbiased=True``, default, matching the ``grpo`` default and
    ``torch.std``; ``unbiased=False`` gives the population std). Token ``t``
    of row ``b`` gets ``A_bt = sum_{steps j of b with end_j >= t} r~_j`` on
    valid tokens. Rows without steps get 0; a group with fewer than 2 steps or
    with all step rewards equal gets exactly 0.

    Raises:
        ValueError: ``ctx.step_rewards`` None or not of length B; a step end
            index outside the row's valid tokens ``[0, L_b - 1]``; non-finite
            step reward; ``G < 2``; ``eps < 0``.
    """
    P, G = ctx.scores.shape
    eps, unbiased = p.eps, p.unbiased
    if eps < 0:
        raise ValueError(f"advantage.eps must be >= 0, got {eps}")
    steps = ctx.step_rewards
    B, T = ctx.mask.shape
    if steps is None or len(steps) != B:
        got = "None" if steps is None else f"length {len(steps)}"
        raise ValueError(
            f"ctx.step_rewards must be a list of B={B} step lists for 'process', got {got}"
        )
    m = float_mask(ctx)
    lengths = right_padded_lengths(ctx.mask).tolist()
    # Per-step tensors: reward, row, end index.
    rows, ends, rewards = [], [], []
    for b, row_steps in enumerate(steps):
        for end, reward in row_steps:
            is_int = isinstance(end, numbers.Integral) and not isinstance(end, bool)
            if not is_int or not 0 <= end < lengths[b]:
                raise ValueError(
                    f"ctx.step_rewards[{b}] end index must be an int in [0, {lengths[b] - 1}] "
                    f"(row's valid tokens), got {end!r}"
                )
            rows.append(b)
            ends.append(int(end))
            rewards.append(float(reward))
    adv = torch.zeros_like(m)
    if not rewards:
        return AdvantageOutput(advantages=adv)
    r = torch.tensor(rewards, dtype=m.dtype, device=m.device)
    if not bool(torch.isfinite(r).all()):
        raise ValueError("ctx.step_rewards must hold finite rewards")
    row_t = torch.tensor(rows, device=m.device)
    group = row_t // G
    # Group statistics over steps via a [P, S] membership mask.
    member = group.unsqueeze(0) == torch.arange(P, device=m.device).unsqueeze(1)  # [P, S]
    r_ps = r.unsqueeze(0).expand(P, -1)
    mean = masked_mean(r_ps, member, dim=-1)  # [P]
    std = masked_var(r_ps, member, unbiased=unbiased, dim=-1).sqrt()
    big = torch.finfo(r.dtype).max
    hi = torch.where(member, r_ps, torch.full_like(r_ps, -big)).amax(dim=-1)
    lo = torch.where(member, r_ps, torch.full_like(r_ps, big)).amin(dim=-1)
    degenerate = (member.sum(dim=-1) < 2) | (hi == lo)  # [P]
    norm = (r - mean[group]) / (std[group] + eps)
    norm = torch.where(degenerate[group], torch.zeros_like(norm), norm)
    # Place each normalised step reward at its end token, then suffix-sum over t.
    placed = torch.zeros_like(m)
    placed.index_put_((row_t, torch.tensor(ends, device=m.device)), norm, accumulate=True)
    adv = torch.flip(torch.cumsum(torch.flip(placed, dims=[1]), dim=1), dims=[1]) * m
    return AdvantageOutput(advantages=adv)


__all__ = [
    "reinforce_pp",
    "reinforce_pp_baseline",
    "ppo",
    "gdpo",
    "process",
    "ReinforcePPParams",
    "ReinforcePPBaselineParams",
    "PPOParams",
    "ProcessParams",
    "ReMaxParams",
    "OPOParams",
    "GDPOParams",
]
