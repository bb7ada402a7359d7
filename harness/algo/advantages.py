"""Outcome-level advantage estimators: sequence rewards ``[P, G]`` -> advantages ``[P, G]``.

``P`` prompts, each with a group of ``G`` sampled completions; ``rewards[p, g]``
is the scalar reward of completion ``g`` of prompt ``p``. Flattened batches are
group-major: row ``b = p * G + g``.

Each estimator is a small function registered by name in
``OUTCOME_ESTIMATORS`` with signature ``fn(rewards, valid, **params) -> [P, G]``;
:func:`compute_advantages` validates inputs and dispatches by config string.

Rules shared by all estimators:

* ``valid[p, g] = False`` (e.g. an empty completion) excludes that completion
  from every statistic; its advantage is 0.
* Group estimators (``requires_groups``): a group whose valid rewards are all
  equal (zero variance) gets exactly 0 (never NaN), as does a group with fewer
  than 2 valid members; ``G < 2`` raises ValueError.
"""

from __future__ import annotations

import inspect
from typing import Callable, Dict, Optional, Set

import torch
from torch import Tensor

from .registry import Registry
from .utils import masked_mean, masked_sum, masked_var, shape_str

OUTCOME_ESTIMATORS: Registry = Registry("outcome estimator")


def outcome_requires_groups(name: str) -> bool:
    """True if outcome estimator ``name`` needs groups of ``G >= 2`` completions.

    Raises:
        ValueError: if ``name`` is not a registered outcome estimator (lists valid names).
    """
    return OUTCOME_ESTIMATORS.requires_groups(name)


# --------------------------------------------------------------------------- helpers


def _group_stats(rewards: Tensor, valid: Tensor):
    """Per-group valid count ``n``, mean and "degenerate" flag, each ``[P, 1]``.

    Degenerate = fewer than 2 valid members or all valid rewards equal. The
    equality test is exact (max == min), so zero-variance groups map to exactly
    0 even when floating-point ``mean`` differs from the shared value.
    """
    n = valid.sum(dim=-1, keepdim=True)
    mean = masked_mean(rewards, valid, dim=-1, keepdim=True)
    big = torch.finfo(rewards.dtype).max
    hi = torch.where(valid, rewards, torch.full_like(rewards, -big)).amax(dim=-1, keepdim=True)
    lo = torch.where(valid, rewards, torch.full_like(rewards, big)).amin(dim=-1, keepdim=True)
    degenerate = (n < 2) | (hi == lo)
    return n, mean, degenerate


def _finalise(adv: Tensor, valid: Tensor, degenerate: Optional[Tensor] = None) -> Tensor:
    keep = valid if degenerate is None else valid & ~degenerate
    return torch.where(keep, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------- estimators

# GRPO denominators by ``scale``: fn(rewards, valid, unbiased, eps) -> [P, 1] or 0-dim.
_GRPO_SCALES: Dict[str, Callable[[Tensor, Tensor, bool, float], Tensor]] = {
    "group": lambda r, v, unbiased, eps: masked_var(
        r, v, unbiased=unbiased, dim=-1, keepdim=True
    ).sqrt()
    + eps,
    "batch": lambda r, v, unbiased, eps: masked_var(r, v, unbiased=unbiased).sqrt() + eps,
    "none": lambda r, v, unbiased, eps: torch.ones((), dtype=r.dtype, device=r.device),
}


@OUTCOME_ESTIMATORS.register("grpo", grouped=True)
def grpo_advantages(
    rewards: Tensor,
    valid: Tensor,
    *,
    eps: float = 1e-6,
    unbiased: bool = True,
    scale: str = "group",
) -> Tensor:
    """GRPO group-normalised advantage.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Shao et al. 2024, DeepSeekMath, sec. 4.1.2 "outcome supervision"):
    ``A_pg = (r_pg - mean_g r) / (std + eps)`` where ``std`` is
    ``scale="group"``: the std of the group's valid rewards (Bessel-corrected if
    ``unbiased``, like ``torch.std`` / verl);
    ``scale="batch"``: the std of all valid rewards of the batch (the
    "local mean, global std" variant, e.g. REINFORCE++-baseline, Hu 2025);
    ``scale="none"``: no division (identical to ``mean_only``).

    Raises:
        ValueError: if ``scale`` is not one of group/batch/none or ``eps < 0``.
    """
    if scale not in _GRPO_SCALES:
        raise ValueError(f"scale must be one of {sorted(_GRPO_SCALES)}; got {scale!r}")
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    _, mean, degenerate = _group_stats(rewards, valid)
    adv = (rewards - mean) / _GRPO_SCALES[scale](rewards, valid, unbiased, eps)
    return _finalise(adv, valid, degenerate)


@OUTCOME_ESTIMATORS.register("mean_only", grouped=True)
def mean_only_advantages(rewards: Tensor, valid: Tensor) -> Tensor:
    """Dr. GRPO advantage: group-mean baseline without std normalisation.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective", Dr. GRPO objective): ``A_pg = r_pg - mean_g r``.

    Raises:
        Nothing beyond :func:`compute_advantages` validation.
    """
    _, mean, degenerate = _group_stats(rewards, valid)
    return _finalise(rewards - mean, valid, degenerate)


@OUTCOME_ESTIMATORS.register("rloo", grouped=True)
def rloo_advantages(rewards: Tensor, valid: Tensor) -> Tensor:
    """REINFORCE leave-one-out advantage.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]``.

    Formula (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for
    Free!"; Ahmadian et al. 2024, "Back to Basics", eq. for RLOO):
    ``A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean)`` over the
    ``n`` valid members of the group.

    Raises:
        Nothing beyond :func:`compute_advantages` validation.
    """
    n, _, degenerate = _group_stats(rewards, valid)
    total = masked_sum(rewards, valid, dim=-1, keepdim=True)
    others = torch.where(n > 1, n - 1, torch.ones_like(n)).to(rewards.dtype)
    adv = rewards - (total - rewards) / others
    return _finalise(adv, valid, degenerate)


def _ema_baseline(rewards: Tensor, valid: Tensor, ema_decay: float, state) -> Tensor:
    if not isinstance(state, dict):
        raise ValueError("state must be a dict when baseline='ema' (holds the EMA baseline)")
    if not 0.0 <= ema_decay <= 1.0:
        raise ValueError(f"ema_decay must be in [0, 1], got {ema_decay}")
    batch_mean = float(masked_mean(rewards, valid))
    prev = state.get("ema")
    b = batch_mean if prev is None else float(prev)
    if bool(valid.any()):
        state["ema"] = ema_decay * b + (1.0 - ema_decay) * batch_mean
    return torch.tensor(b, dtype=rewards.dtype, device=rewards.device)


# REINFORCE baselines by name: fn(rewards, valid, ema_decay, state) -> 0-dim baseline.
_REINFORCE_BASELINES: Dict[str, Callable] = {
    "none": lambda r, v, d, s: torch.zeros((), dtype=r.dtype, device=r.device),
    "batch_mean": lambda r, v, d, s: masked_mean(r, v),
    "ema": _ema_baseline,
}


@OUTCOME_ESTIMATORS.register("reinforce", grouped=False)
def reinforce_advantages(
    rewards: Tensor,
    valid: Tensor,
    *,
    baseline: str = "none",
    ema_decay: float = 0.9,
    state: Optional[Dict] = None,
) -> Tensor:
    """Vanilla REINFORCE advantage with an optional scalar baseline.

    Shapes: ``rewards``, ``valid``: ``[P, G]`` -> ``[P, G]`` (works for ``G = 1``).

    Formula (Williams 1992): ``A = r - b`` with
    ``baseline="none"``: ``b = 0``;
    ``baseline="batch_mean"``: ``b`` = mean of the batch's valid rewards;
    ``baseline="ema"``: ``b = state["ema"]`` (the value *before* this call's
    update; on the first call, when ``"ema"`` is absent, ``b`` = batch mean).
    After use, ``state["ema"] = ema_decay * b + (1 - ema_decay) * batch_mean``
    (a python float). A batch with no valid reward leaves the state unchanged.

    Raises:
        ValueError: if ``baseline`` is unknown, ``baseline="ema"`` without a
            ``state`` dict, or ``ema_decay`` not in ``[0, 1]``.
    """
    if baseline not in _REINFORCE_BASELINES:
        raise ValueError(
            f"baseline must be one of {sorted(_REINFORCE_BASELINES)}; got {baseline!r}"
        )
    b = _REINFORCE_BASELINES[baseline](rewards, valid, ema_decay, state)
    return _finalise(rewards - b, valid)


# --------------------------------------------------------------------------- dispatch


def check_params(fn: Callable, params: Dict, what: str, exclude: Set[str] = frozenset()) -> None:
    """Raise ValueError if ``params`` holds a keyword ``fn`` does not accept.

    Accepted keywords are ``fn``'s keyword-only parameters minus ``exclude``.
    """
    sig = inspect.signature(fn)
    accepted = [
        p.name
        for p in sig.parameters.values()
        if p.kind == inspect.Parameter.KEYWORD_ONLY and p.name not in exclude
    ]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for {what}; accepted: {accepted or 'none'}"
        )


def compute_advantages(
    rewards: Tensor, estimator: str, *, valid: Optional[Tensor] = None, **params
) -> Tensor:
    """Outcome advantages for a batch of prompt groups, estimator chosen by name.

    Shapes: ``rewards``: ``[P, G]`` float (row-major groups; flatten with
    ``.reshape(-1)`` to get group-major ``[B]``); ``valid``: ``[P, G]`` bool or
    None (all valid) -> advantages ``[P, G]`` in rewards' float dtype, 0 where
    ``valid`` is False.

    ``estimator`` is one of ``OUTCOME_ESTIMATORS.names()`` (grpo, mean_only,
    rloo, reinforce); ``params`` are that estimator's keyword options (see each
    ``*_advantages`` docstring).

    Raises:
        ValueError: unknown ``estimator`` (lists valid names); unknown keyword in
            ``params`` (lists accepted ones); ``rewards`` not a 2-D tensor;
            ``valid`` of a different shape; non-finite valid rewards;
            ``G < 2`` for a group estimator ("group_size must be >= 2 for
            estimator 'grpo'"); any estimator-specific ValueError.
    """
    fn = OUTCOME_ESTIMATORS.get(estimator)
    check_params(fn, params, f"estimator {estimator!r}")
    if not isinstance(rewards, Tensor) or rewards.dim() != 2:
        got = shape_str(rewards) if isinstance(rewards, Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a [P, G] tensor, got {got}")
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    if valid is None:
        valid = torch.ones_like(rewards, dtype=torch.bool)
    elif not isinstance(valid, Tensor) or valid.shape != rewards.shape:
        got = shape_str(valid) if isinstance(valid, Tensor) else type(valid).__name__
        raise ValueError(f"valid must be a bool tensor of shape {shape_str(rewards)}, got {got}")
    valid = valid.to(torch.bool)
    if OUTCOME_ESTIMATORS.requires_groups(estimator) and rewards.shape[1] < 2:
        raise ValueError(
            f"group_size must be >= 2 for estimator {estimator!r}, got G={rewards.shape[1]}"
        )
    if not bool(torch.isfinite(rewards[valid]).all()):
        raise ValueError("rewards must be finite at valid positions (found NaN or inf)")
    return fn(rewards, valid, **params)


__all__ = [
    "OUTCOME_ESTIMATORS",
    "compute_advantages",
    "outcome_requires_groups",
    "grpo_advantages",
    "mean_only_advantages",
    "rloo_advantages",
    "reinforce_advantages",
    "check_params",
]
