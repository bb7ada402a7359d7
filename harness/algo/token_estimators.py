"""Token-level advantage estimators selectable by config name (the trainer's entry point).

Every estimator has the uniform signature
``fn(ctx: AdvantageContext, params) -> AdvantageOutput`` and is registered in
``TOKEN_ESTIMATORS`` with its params dataclass (the Hydra schema of ``advantage=<name>``) and
the extra inputs it ``needs``; :func:`estimate_advantages` dispatches by name.

Layout: ``P`` prompts x ``G`` completions, ``B = P * G`` rows in group-major
order (row ``b = p * G + g``), ``T`` padded completion length, right padding.

Registered names: the outcome estimators of :mod:`.advantages` broadcast over
each row's valid tokens (``grpo``, ``mean_only``, ``rloo``, ``reinforce``),
``reinforce_pp``, ``reinforce_pp_baseline``, ``ppo`` and ``process``.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch
from torch import Tensor

from . import rescaled  # noqa: F401  (registers its outcome estimators before they are wrapped below)
from .advantages import OUTCOME_ESTIMATORS, compute_advantages
from .gae import gae, reinforce_pp_returns
from .registry import Registry
from .utils import masked_mean, masked_var, masked_whiten, right_padded_lengths, shape_str


@dataclass
class AdvantageContext:
    """Everything an estimator may need for one batch.

    Attributes:
        scores: ``[P, G]`` sequence-level reward (outcome reward plus any
            reward-placed KL summed over tokens).
        token_rewards: ``[B, T]`` per-token reward: outcome reward at the last
            valid token plus per-token reward-placed terms (e.g. ``-beta*KL``);
            zeros elsewhere.
        mask: ``[B, T]`` completion mask (1 = real token), right-padded.
        values: ``[B, T]`` critic values (``ppo`` only).
        step_rewards: per row, a list of ``(end_index, reward)`` with the
            inclusive token index where a reasoning step ends (``process`` only).
        greedy_scores: ``[P]`` reward of each prompt's greedy completion (``remax`` only).
        state: persistent estimator state across steps (EMA baseline); keep the
            same dict alive between calls.
    """

    scores: Tensor
    token_rewards: Tensor
    mask: Tensor
    values: Optional[Tensor] = None
    step_rewards: Optional[List[List[Tuple[int, float]]]] = None
    state: dict = field(default_factory=dict)
    greedy_scores: Optional[Tensor] = None


@dataclass
class AdvantageOutput:
    """Estimator result: ``advantages`` ``[B, T]`` (0 at masked positions) and,
    for critic-based estimators, ``returns`` ``[B, T]`` value targets."""

    advantages: Tensor
    returns: Optional[Tensor] = None


TOKEN_ESTIMATORS: Registry = Registry("advantage estimator")


def requires_groups(name: str) -> bool:
    """True if estimator ``name`` (any ``TOKEN_ESTIMATORS`` name, which include
    all outcome estimator names) needs groups of ``G >= 2`` completions per prompt.

    Raises:
        ValueError: if ``name`` is not registered (lists valid names).
    """
    return TOKEN_ESTIMATORS.requires_groups(name)


# --------------------------------------------------------------------------- helpers


def _check_ctx(ctx: AdvantageContext, name: str) -> Tuple[int, int]:
    """Validate shapes; return (P, G)."""
    if not isinstance(ctx, AdvantageContext):
        raise ValueError(f"ctx must be an AdvantageContext, got {type(ctx).__name__}")
    right_padded_lengths(ctx.mask)
    if not isinstance(ctx.scores, Tensor) or ctx.scores.dim() != 2:
        raise ValueError("ctx.scores must be a [P, G] tensor")
    P, G = ctx.scores.shape
    B, T = ctx.mask.shape
    if B != P * G:
        raise ValueError(
            f"ctx.mask must have B = P*G = {P * G} rows for scores {shape_str(ctx.scores)}, got {B}"
        )
    if not isinstance(ctx.token_rewards, Tensor) or ctx.token_rewards.shape != ctx.mask.shape:
        raise ValueError(f"ctx.token_rewards must have the mask's shape {shape_str(ctx.mask)}")
    if TOKEN_ESTIMATORS.requires_groups(name) and G < 2:
        raise ValueError(f"group_size must be >= 2 for estimator {name!r}, got G={G}")
    return P, G


def _f64(x):
    return x.to(torch.float64) if isinstance(x, Tensor) and x.is_floating_point() else x


def in_float64(fn: Callable) -> Callable:
    """Run estimator ``fn`` in float64 and return its outputs in the dtype of ``ctx.token_rewards``.

    Convention (every registered estimator): group and batch statistics (means, stds,
    whitening, leave-one-out terms, GAE) are computed in float64 on the float64 image of the
    inputs, so a float32 batch gives the float64 result up to the final rounding to float32.
    Computed in float32, near-constant groups and batches lose most of their digits to
    cancellation (NeMo-RL #4158 / PR #4161); the tensors are ``[P, G]`` and ``[B, T]``, so the
    cost is negligible next to the model.
    """

    @functools.wraps(fn)
    def wrapper(ctx: AdvantageContext, p) -> AdvantageOutput:
        if not isinstance(ctx, AdvantageContext):
            raise ValueError(f"ctx must be an AdvantageContext, got {type(ctx).__name__}")
        tr = ctx.token_rewards
        dtype = tr.dtype if isinstance(tr, Tensor) and tr.is_floating_point() else torch.get_default_dtype()
        wide = dataclasses.replace(ctx, scores=_f64(ctx.scores), token_rewards=_f64(tr), values=_f64(ctx.values),
                                   greedy_scores=_f64(ctx.greedy_scores))
        out = fn(wide, p)
        return AdvantageOutput(advantages=out.advantages.to(dtype),
                               returns=None if out.returns is None else out.returns.to(dtype))

    return wrapper


def _float_mask(ctx: AdvantageContext) -> Tensor:
    tr = ctx.token_rewards
    dtype = tr.dtype if tr.is_floating_point() else torch.get_default_dtype()
    return ctx.mask.to(dtype)


def _broadcast(seq_adv: Tensor, mask: Tensor) -> Tensor:
    """``[P, G]`` sequence advantages -> ``[B, T]`` on valid tokens."""
    adv = seq_adv.reshape(-1, 1).to(mask.dtype).expand_as(mask)
    return torch.where(mask > 0, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------- outcome wrappers


def _make_outcome_estimator(name: str) -> Callable:
    spec = OUTCOME_ESTIMATORS.spec(name)

    def estimator(ctx: AdvantageContext, p) -> AdvantageOutput:
        P, G = _check_ctx(ctx, name)
        m = _float_mask(ctx)
        valid = (ctx.mask.to(torch.bool).sum(dim=-1) > 0).reshape(P, G)
        seq_adv = compute_advantages(ctx.scores, name, valid=valid, params=p, state=ctx.state)
        return AdvantageOutput(advantages=_broadcast(seq_adv, m))

    estimator.__name__ = f"{name}_token_estimator"
    estimator.__doc__ = (
        f"Outcome estimator {name!r} broadcast to tokens.\n\n"
        "Shapes: ``ctx.scores`` ``[P, G]`` -> advantages ``[B, T]`` equal to the\n"
        "row's sequence advantage on its valid tokens, 0 elsewhere. Rows with no\n"
        "valid token are excluded from group statistics (``valid`` = mask.sum(-1) > 0).\n"
        f"Params and formula: see ``{spec.fn.__module__}."
        f"{spec.fn.__name__}``.\n\nRaises:\n    ValueError: as "
        "``compute_advantages`` plus context shape errors."
    )
    return estimator


for _name in OUTCOME_ESTIMATORS.names():
    _spec = OUTCOME_ESTIMATORS.spec(_name)
    TOKEN_ESTIMATORS.register(_name, params=_spec.params, grouped=_spec.grouped, invariances=_spec.invariances)(
        in_float64(_make_outcome_estimator(_name)))


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
@in_float64
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
    _check_ctx(ctx, "reinforce_pp")
    m = _float_mask(ctx)
    returns = reinforce_pp_returns(ctx.token_rewards, ctx.mask, gamma=p.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, m, unbiased=p.unbiased))


@TOKEN_ESTIMATORS.register("reinforce_pp_baseline", params=ReinforcePPBaselineParams, grouped=True,
                           invariances=("permutation", "shift", "scale"))
@in_float64
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
    P, G = _check_ctx(ctx, "reinforce_pp_baseline")
    m = _float_mask(ctx)
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
    """``advantage=ppo``: GAE with a learned critic (``critic.*``, harness/critic.py). gamma=1:
    rewards are episodic and undiscounted (the outcome reward sits on the last token); lam=0.95
    as in the GAE paper and verl/OpenRLHF."""

    name: str = "ppo"
    gamma: float = 1.0
    lam: float = 0.95
    whiten: bool = True  # whiten advantages over the batch's valid tokens
    unbiased: bool = True  # whitening variance: Bessel-corrected (verl) or population (OpenRLHF)


@TOKEN_ESTIMATORS.register("ppo", params=PPOParams, grouped=False, needs=("values",), invariances=("permutation",))
@in_float64
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
    _check_ctx(ctx, "ppo")
    if ctx.values is None:
        raise ValueError("ctx.values must be a [B, T] tensor of critic values for estimator 'ppo'")
    adv, returns = gae(ctx.token_rewards, ctx.values, ctx.mask, gamma=p.gamma, lam=p.lam)
    if p.whiten:
        adv = masked_whiten(adv, _float_mask(ctx), unbiased=p.unbiased)
    return AdvantageOutput(advantages=adv, returns=returns)


# --------------------------------------------------------------------------- ReMax, OPO


@dataclass
class ReMaxParams:
    """``advantage=remax``: ReMax (Li et al. 2023), the greedy completion's reward as baseline."""

    name: str = "remax"


@TOKEN_ESTIMATORS.register("remax", params=ReMaxParams, grouped=False, needs=("greedy",),
                           invariances=("permutation", "shift", "scale_equivariant"))
@in_float64
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
    P, G = _check_ctx(ctx, "remax")
    if ctx.greedy_scores is None or tuple(ctx.greedy_scores.shape) != (P,):
        raise ValueError(f"ctx.greedy_scores must be a [P]=[{P}] tensor of greedy rewards for estimator 'remax'")
    m = _float_mask(ctx)
    seq = ctx.scores.to(m.dtype) - ctx.greedy_scores.to(m.dtype).unsqueeze(-1)
    valid = (ctx.mask.to(torch.bool).sum(-1) > 0).reshape(P, G)
    return AdvantageOutput(advantages=_broadcast(torch.where(valid, seq, torch.zeros_like(seq)), m))


@dataclass
class OPOParams:
    """``advantage=opo``: on-policy RL with the optimal reward baseline (Hao et al. 2025)."""

    name: str = "opo"


@TOKEN_ESTIMATORS.register("opo", params=OPOParams, grouped=True,
                           invariances=("permutation", "shift", "scale_equivariant", "constant_zero"))
@in_float64
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
    P, G = _check_ctx(ctx, "opo")
    m = _float_mask(ctx)
    lengths = m.sum(-1).reshape(P, G)
    r = ctx.scores.to(m.dtype)
    valid = lengths > 0
    b = (lengths * r).sum(-1, keepdim=True) / lengths.sum(-1, keepdim=True).clamp(min=1)
    hi = torch.where(valid, r, torch.full_like(r, -torch.inf)).amax(-1, keepdim=True)
    lo = torch.where(valid, r, torch.full_like(r, torch.inf)).amin(-1, keepdim=True)
    adv = torch.where(valid & (hi != lo), r - b, torch.zeros_like(r))
    return AdvantageOutput(advantages=_broadcast(adv, m))


# --------------------------------------------------------------------------- process


@dataclass
class ProcessParams:
    """``advantage=process``: GRPO with process supervision (DeepSeekMath sec. 4.1.3)."""

    name: str = "process"
    eps: float = 1e-6
    unbiased: bool = True


@TOKEN_ESTIMATORS.register("process", params=ProcessParams, grouped=True, needs=("step_rewards",),
                           invariances=("permutation", "shift", "scale", "constant_zero"))
@in_float64
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
    P, G = _check_ctx(ctx, "process")
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
    m = _float_mask(ctx)
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


# --------------------------------------------------------------------------- dispatch


def estimate_advantages(name: str, ctx: AdvantageContext, params=None, **overrides) -> AdvantageOutput:
    """Run the token-level advantage estimator registered as ``name`` on ``ctx``.

    Args:
        params: an instance or mapping of the estimator's params dataclass (the trainer passes
            ``cfg.advantage``); missing fields take the dataclass defaults.
        overrides: single fields replaced on top (tests: ``estimate_advantages("ppo", ctx, lam=0.8)``).

    Shapes: see :class:`AdvantageContext` -> :class:`AdvantageOutput` with
    ``advantages`` ``[B, T]`` (0 at masked positions) and, for ``ppo``,
    ``returns`` ``[B, T]``.

    Raises:
        ValueError: unknown ``name`` (lists valid names); a parameter that is not a field of
            the estimator's params (lists accepted ones); any estimator-specific ValueError.
    """
    spec = TOKEN_ESTIMATORS.spec(name)
    return spec.fn(ctx, spec.build(params, **overrides))


__all__ = [
    "AdvantageContext",
    "AdvantageOutput",
    "TOKEN_ESTIMATORS",
    "estimate_advantages",
    "requires_groups",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "ppo",
    "process",
    "ReinforcePPParams",
    "ReinforcePPBaselineParams",
    "PPOParams",
    "ProcessParams",
    "ReMaxParams",
    "OPOParams",
]
