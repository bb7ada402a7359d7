"""The advantage-estimator registry: one registry for every estimator, outcome-level or token-level.

Every estimator is registered in ``TOKEN_ESTIMATORS`` under its config name (``advantage=<name>``)
with its params dataclass (the Hydra schema of that option), the inputs it ``needs`` and whether
it needs groups, and has the uniform signature ``fn(ctx: AdvantageContext, p) -> AdvantageOutput``
(token-level advantages ``[B, T]``). Two kinds of function are registered:

* outcome estimators (:mod:`.advantages`, :mod:`.rescaled`): ``fn(rewards [P, G], valid [P, G],
  p, state) -> [P, G]``, registered with :func:`outcome_estimator`, which registers the
  token-level form (the row's advantage on each of its valid tokens, computed in float64) and
  keeps the outcome function for :func:`compute_advantages`;
* token estimators (:mod:`.token_estimators`): ``fn(ctx, p)`` registered directly
  (``@TOKEN_ESTIMATORS.register(...)`` and ``@in_float64``).

Layout: ``P`` prompts x ``G`` completions, ``B = P * G`` rows in group-major
order (row ``b = p * G + g``), ``T`` padded completion length, right padding.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from .registry import Registry
from .utils import right_padded_lengths, shape_str

TOKEN_ESTIMATORS: Registry = Registry("advantage estimator")

# outcome-level form of each outcome estimator: name -> fn(rewards [P, G], valid, p, state) -> [P, G]
_OUTCOME_FNS: Dict[str, Callable] = {}


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
        reward_components: ``[P, G, K]`` the reward's named components before they are summed
            (correctness, format, overlong penalty, the rest of the shaping; ``gdpo`` only), and
            ``reward_weights`` ``[K]`` the weight of each in the summed reward.
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
    reward_components: Optional[Tensor] = None
    reward_weights: Optional[Tensor] = None


@dataclass
class AdvantageOutput:
    """Estimator result: ``advantages`` ``[B, T]`` (0 at masked positions) and,
    for critic-based estimators, ``returns`` ``[B, T]`` value targets."""

    advantages: Tensor
    returns: Optional[Tensor] = None


# --------------------------------------------------------------------------- helpers


def check_context(ctx: AdvantageContext, name: str) -> Tuple[int, int]:
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
                                   greedy_scores=_f64(ctx.greedy_scores),
                                   reward_components=_f64(ctx.reward_components), reward_weights=_f64(ctx.reward_weights))
        out = fn(wide, p)
        return AdvantageOutput(advantages=out.advantages.to(dtype),
                               returns=None if out.returns is None else out.returns.to(dtype))

    return wrapper


def float_mask(ctx: AdvantageContext) -> Tensor:
    tr = ctx.token_rewards
    dtype = tr.dtype if tr.is_floating_point() else torch.get_default_dtype()
    return ctx.mask.to(dtype)


def broadcast(seq_adv: Tensor, mask: Tensor) -> Tensor:
    """``[P, G]`` sequence advantages -> ``[B, T]`` on valid tokens."""
    adv = seq_adv.reshape(-1, 1).to(mask.dtype).expand_as(mask)
    return torch.where(mask > 0, adv, torch.zeros_like(adv))


# --------------------------------------------------------------------------- registration


def outcome_estimator(name: str, *, params: type, grouped: bool, invariances=()) -> Callable:
    """Decorator registering an outcome estimator ``fn(rewards [P, G], valid [P, G], p, state) -> [P, G]``
    in ``TOKEN_ESTIMATORS`` under ``name``, broadcast to tokens; returns ``fn`` unchanged.

    The registered token-level form gives advantages ``[B, T]`` equal to the row's outcome
    advantage on its valid tokens and 0 elsewhere; rows with no valid token are excluded from
    the group statistics (``valid`` = ``mask.sum(-1) > 0``). Arguments as
    :meth:`harness.algo.registry.Registry.register`.
    """

    def decorator(fn: Callable) -> Callable:
        _OUTCOME_FNS[name] = fn
        TOKEN_ESTIMATORS.register(name, params=params, grouped=grouped, invariances=invariances)(
            in_float64(_broadcast_outcome(name, fn, grouped)))
        return fn

    return decorator


def _broadcast_outcome(name: str, fn: Callable, grouped: bool) -> Callable:
    def estimator(ctx: AdvantageContext, p) -> AdvantageOutput:
        P, G = check_context(ctx, name)
        m = float_mask(ctx)
        valid = (ctx.mask.to(torch.bool).sum(dim=-1) > 0).reshape(P, G)
        seq_adv = _run_outcome(name, fn, grouped, ctx.scores, valid, p, ctx.state)
        return AdvantageOutput(advantages=broadcast(seq_adv, m))

    estimator.__name__ = f"{name}_token_estimator"
    estimator.__doc__ = (
        f"Outcome estimator {name!r} broadcast to tokens.\n\n"
        "Shapes: ``ctx.scores`` ``[P, G]`` -> advantages ``[B, T]`` equal to the\n"
        "row's sequence advantage on its valid tokens, 0 elsewhere. Rows with no\n"
        "valid token are excluded from group statistics (``valid`` = mask.sum(-1) > 0).\n"
        f"Params and formula: see ``{fn.__module__}.{fn.__name__}``.\n\nRaises:\n    ValueError: as "
        "``compute_advantages`` plus context shape errors."
    )
    return estimator


def requires_groups(name: str) -> bool:
    """True if estimator ``name`` needs groups of ``G >= 2`` completions per prompt.

    Raises:
        ValueError: if ``name`` is not registered (lists valid names).
    """
    return TOKEN_ESTIMATORS.requires_groups(name)


def outcome_names() -> List[str]:
    """Sorted names of the outcome estimators (those :func:`compute_advantages` accepts)."""
    return sorted(_OUTCOME_FNS)


# --------------------------------------------------------------------------- dispatch


def compute_advantages(
    rewards: Tensor, estimator: str, *, valid: Optional[Tensor] = None, params=None,
    state: Optional[Dict] = None, **overrides
) -> Tensor:
    """Outcome advantages for a batch of prompt groups, estimator chosen by name.

    Shapes: ``rewards``: ``[P, G]`` float (row-major groups; flatten with
    ``.reshape(-1)`` to get group-major ``[B]``); ``valid``: ``[P, G]`` bool or
    None (all valid) -> advantages ``[P, G]`` in rewards' float dtype, 0 where
    ``valid`` is False.

    ``estimator`` is one of :func:`outcome_names` (grpo, mean_only, rloo, reinforce,
    grpo_passk, and from :mod:`harness.algo.rescaled` max_rl, gpg); ``params`` an instance (or
    mapping) of its params dataclass, and ``overrides`` replace single fields
    (``compute_advantages(r, "grpo", eps=0.0)``). ``state`` is the persistent dict of stateful
    estimators (reinforce's EMA).

    Raises:
        ValueError: unknown ``estimator`` (lists valid names), or a token-level one; a parameter
            that is not a field of the estimator's params (lists accepted ones); ``rewards`` not
            a 2-D tensor; ``valid`` of a different shape; non-finite valid rewards;
            ``G < 2`` for a group estimator ("group_size must be >= 2 for
            estimator 'grpo'"); any estimator-specific ValueError.
    """
    spec = TOKEN_ESTIMATORS.spec(estimator)
    if spec.name not in _OUTCOME_FNS:
        raise ValueError(f"advantage estimator {estimator!r} is token-level (it needs an AdvantageContext: "
                         f"estimate_advantages); outcome estimators: {', '.join(outcome_names())}")
    return _run_outcome(spec.name, _OUTCOME_FNS[spec.name], spec.grouped, rewards, valid,
                        spec.build(params, **overrides), state)


def _run_outcome(name: str, fn: Callable, grouped: bool, rewards: Tensor, valid: Optional[Tensor], p,
                 state: Optional[Dict]) -> Tensor:
    """:func:`compute_advantages` for the outcome function ``fn`` of estimator ``name`` and its
    built params ``p``: checks the inputs, runs ``fn`` in float64, returns in rewards' dtype."""
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
    if grouped and rewards.shape[1] < 2:
        raise ValueError(
            f"group_size must be >= 2 for estimator {name!r}, got G={rewards.shape[1]}"
        )
    if not bool(torch.isfinite(rewards[valid]).all()):
        raise ValueError("rewards must be finite at valid positions (found NaN or inf)")
    # Convention: the group statistics are computed in float64 (see in_float64).
    return fn(rewards.to(torch.float64), valid, p, state).to(rewards.dtype)


def estimate_advantages(name: str, ctx: AdvantageContext, params=None, **overrides) -> AdvantageOutput:
    """Run the advantage estimator registered as ``name`` on ``ctx``.

    Args:
        params: an instance or mapping of the estimator's params dataclass; missing fields take
            the dataclass defaults.
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
    "TOKEN_ESTIMATORS",
    "AdvantageContext",
    "AdvantageOutput",
    "outcome_estimator",
    "in_float64",
    "compute_advantages",
    "estimate_advantages",
    "requires_groups",
    "outcome_names",
    "check_context",
    "float_mask",
    "broadcast",
]
