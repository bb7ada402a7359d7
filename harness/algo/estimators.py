"""The advantage estimators: one registry, and the one adapter between the trainer and the formula.

Every estimator is a plain function registered in ``TOKEN_ESTIMATORS`` under its config name
(``advantage=<name>``), with its params dataclass (the Hydra schema of that option), the inputs it
``needs`` and whether it is ``grouped``. Two kinds:

* outcome estimators (:mod:`.advantages`, :mod:`.rescaled`): ``fn(rewards [P, G], valid [P, G],
  p, state) -> [P, G]``, one advantage per completion, registered with :func:`outcome_estimator`;
* token estimators (:mod:`.token_estimators`): ``fn(ctx, p) -> AdvantageOutput``, ``[B, T]``.

The trainer calls the run's :class:`Estimator` on an :class:`AdvantageContext`; it checks the
context, packs the model's tokens when tool observations leave holes in the mask, runs the
function in float64 and puts an outcome advantage on every token of its row. The functions
themselves receive checked float64 inputs and check only their own params and inputs.

Layout: ``P`` prompts x ``G`` completions, ``B = P * G`` rows in group-major
order (row ``b = p * G + g``), ``T`` padded completion length, right padding.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from harness.registry import Choice, Registry
from .utils import right_padded_lengths, shape_str

TOKEN_ESTIMATORS: Registry = Registry("advantage estimator")


@dataclass
class AdvantageContext:
    """Everything an estimator may need for one batch.

    Attributes:
        scores: ``[P, G]`` sequence-level reward (outcome reward plus any
            reward-placed KL summed over tokens).
        token_rewards: ``[B, T]`` per-token reward: outcome reward at the last
            valid token plus per-token reward-placed terms (e.g. ``-beta*KL``);
            zeros elsewhere.
        mask: ``[B, T]`` loss mask (1 = a model token): right-padded, or with holes where tool
            observations sit between the model's tokens.
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


def float_mask(ctx: AdvantageContext) -> Tensor:
    """``ctx.mask`` in the dtype of ``ctx.token_rewards`` (float64 inside an estimator)."""
    tr = ctx.token_rewards
    dtype = tr.dtype if tr.is_floating_point() else torch.get_default_dtype()
    return ctx.mask.to(dtype)


def broadcast(seq_adv: Tensor, mask: Tensor) -> Tensor:
    """``[P, G]`` sequence advantages -> ``[B, T]`` on valid tokens."""
    adv = seq_adv.reshape(-1, 1).to(mask.dtype).expand_as(mask)
    return torch.where(mask > 0, adv, torch.zeros_like(adv))


def left_pack_order(mask: Tensor) -> Tensor:
    """``[B, T]`` long: per row, the positions of its mask's 1s in order, then those of its 0s.

    ``x.gather(1, order)`` packs a row's masked tokens to the left (right-padded mask);
    ``out.scatter_(1, order, y)`` puts packed values back in place.
    """
    return torch.argsort((mask == 0).long(), dim=1, stable=True)


def has_holes(mask: Tensor) -> bool:
    """True when some row of ``mask`` ``[B, T]`` has a 1 after a 0 (it is not right-padded)."""
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        return False  # not a mask: _check_context names it
    m = mask.bool()
    return m.shape[1] >= 2 and bool((m[:, 1:] & ~m[:, :-1]).any())


def _f64(x):
    return x.to(torch.float64) if isinstance(x, Tensor) and x.is_floating_point() else x


def _check_finite(rewards: Tensor, valid: Tensor) -> None:
    if not bool(torch.isfinite(rewards[valid]).all()):
        raise ValueError("rewards must be finite at valid positions (found NaN or inf)")


def _check_context(ctx: AdvantageContext) -> None:
    """Raise ValueError unless the context's shapes agree (``mask`` right-padded: packed if it had holes)."""
    right_padded_lengths(ctx.mask)
    if not isinstance(ctx.scores, Tensor) or ctx.scores.dim() != 2:
        raise ValueError("ctx.scores must be a [P, G] tensor")
    P, G = ctx.scores.shape
    if ctx.mask.shape[0] != P * G:
        raise ValueError(f"ctx.mask must have B = P*G = {P * G} rows for scores {shape_str(ctx.scores)}, "
                         f"got {ctx.mask.shape[0]}")
    if not isinstance(ctx.token_rewards, Tensor) or ctx.token_rewards.shape != ctx.mask.shape:
        raise ValueError(f"ctx.token_rewards must have the mask's shape {shape_str(ctx.mask)}")


@dataclass(frozen=True)
class Estimator(Choice):
    """The run's advantage estimator (``advantage=<name>``): its registry record and params.

    ``estimator(ctx) -> AdvantageOutput`` is the one adapter between the trainer and the formula:

    1. a mask with holes (tool observations between the model's tokens) is packed: each row's
       model tokens moved to the left, in order (``token_rewards``, ``values`` and ``mask``), so
       the estimator sees an episode as the sequence of its model tokens: returns and GAE run
       over model tokens only (gamma and lambda discount per model token), as verl's multi-turn
       GAE skips masked positions, and token statistics count model tokens only;
    2. the context is checked once (:func:`_check_context`);
    3. the float inputs are cast to float64: group and batch statistics (means, stds, whitening,
       leave-one-out terms, GAE) computed in float32 lose most of their digits to cancellation
       on near-constant groups (NeMo-RL #4158 / PR #4161); the tensors are ``[P, G]`` and
       ``[B, T]``, so the cost is negligible next to the model;
    4. the registered function runs on the float64 context (an outcome estimator's token form:
       :func:`outcome_estimator`);
    5. the outputs return in the dtype of ``ctx.token_rewards``, unpacked to the original
       positions (0 where the mask is 0).

    The group size (``G >= 2`` for a grouped estimator) and step rewards with tool observations
    are checked at startup (:func:`harness.launch.validate.validate`), and by
    :func:`estimate_advantages` for direct calls.

    Raises:
        ValueError: a malformed context (its type and shapes), or the estimator's own checks of
            its params and inputs (an outcome estimator: non-finite rewards).
    """

    def __call__(self, ctx: AdvantageContext) -> AdvantageOutput:
        if not isinstance(ctx, AdvantageContext):
            raise ValueError(f"ctx must be an AdvantageContext, got {type(ctx).__name__}")
        order = left_pack_order(ctx.mask) if has_holes(ctx.mask) else None
        packed = ctx if order is None else dataclasses.replace(
            ctx, token_rewards=_pack(ctx.token_rewards, order), mask=_pack(ctx.mask, order),
            values=_pack(ctx.values, order))
        _check_context(packed)
        tr = ctx.token_rewards
        dtype = tr.dtype if tr.is_floating_point() else torch.get_default_dtype()
        wide = dataclasses.replace(packed, scores=_f64(ctx.scores), token_rewards=_f64(packed.token_rewards),
                                   values=_f64(packed.values), greedy_scores=_f64(ctx.greedy_scores),
                                   reward_components=_f64(ctx.reward_components),
                                   reward_weights=_f64(ctx.reward_weights))
        out = self.spec.fn(wide, self.params)
        return AdvantageOutput(advantages=_unpack(out.advantages.to(dtype), order, ctx.mask),
                               returns=None if out.returns is None else _unpack(out.returns.to(dtype), order, ctx.mask))


def _pack(x: Optional[Tensor], order: Tensor) -> Optional[Tensor]:
    return None if x is None else x.gather(1, order)


def _unpack(y: Tensor, order: Optional[Tensor], mask: Tensor) -> Tensor:
    """``y`` back in the original positions of a packed context (``order`` None: as it is)."""
    if order is None:
        return y
    out = torch.zeros_like(y)
    out.scatter_(1, order, y)
    return out * mask.to(out.dtype)


def outcome_estimator(name: str, *, params: type, grouped: bool, invariances=()) -> Callable:
    """Decorator registering an outcome estimator ``fn(rewards [P, G], valid [P, G], p, state) -> [P, G]``
    in ``TOKEN_ESTIMATORS`` under ``name``; returns ``fn`` unchanged.

    The registered function is its token form ``(ctx, p) -> AdvantageOutput``: ``fn`` on
    ``ctx.scores`` and ``valid`` (the rows with a model token; the others leave every group
    statistic), its advantage on every model token of the row, 0 elsewhere. The record keeps
    ``fn`` as ``outcome`` (:func:`compute_advantages` calls it). Arguments as
    :meth:`harness.registry.Registry.register`.
    """

    def decorator(fn: Callable) -> Callable:
        def on_tokens(ctx: AdvantageContext, p) -> AdvantageOutput:
            P, G = ctx.scores.shape
            valid = (ctx.mask.to(torch.bool).sum(dim=-1) > 0).reshape(P, G)
            scores = ctx.scores if ctx.scores.is_floating_point() else ctx.scores.to(torch.float64)
            _check_finite(scores, valid)
            return AdvantageOutput(advantages=broadcast(fn(scores, valid, p, ctx.state), float_mask(ctx)))

        on_tokens.__name__ = on_tokens.__qualname__ = f"{name}_on_tokens"
        on_tokens.__doc__ = f"{fn.__module__}.{fn.__name__} ([P, G]) on the tokens of each row ([B, T])."
        TOKEN_ESTIMATORS.register(name, params=params, grouped=grouped, outcome=fn, invariances=invariances)(on_tokens)
        return fn

    return decorator


def requires_groups(name: str) -> bool:
    """True if estimator ``name`` needs groups of ``G >= 2`` completions per prompt.

    Raises:
        ValueError: if ``name`` is not registered (lists valid names).
    """
    return TOKEN_ESTIMATORS.requires_groups(name)


def outcome_names() -> List[str]:
    """Sorted names of the outcome estimators (those :func:`compute_advantages` accepts)."""
    return [n for n in TOKEN_ESTIMATORS.names() if TOKEN_ESTIMATORS.spec(n).outcome is not None]


def _check_group_size(name: str, grouped: bool, G: int) -> None:
    if grouped and G < 2:
        raise ValueError(f"group_size must be >= 2 for estimator {name!r}, got G={G}")


def compute_advantages(
    rewards: Tensor, estimator: str, *, valid: Optional[Tensor] = None, params=None,
    state: Optional[Dict] = None, **overrides
) -> Tensor:
    """Outcome advantages for a batch of prompt groups, estimator chosen by name.

    Shapes: ``rewards``: ``[P, G]`` float (row-major groups; flatten with
    ``.reshape(-1)`` to get group-major ``[B]``); ``valid``: ``[P, G]`` bool or
    None (all valid) -> advantages ``[P, G]`` in rewards' float dtype, 0 where
    ``valid`` is False; computed in float64 (see :class:`Estimator`).

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
    if spec.outcome is None:
        raise ValueError(f"advantage estimator {estimator!r} is token-level (it needs an AdvantageContext: "
                         f"estimate_advantages); outcome estimators: {', '.join(outcome_names())}")
    p = spec.build(params, **overrides)
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
    _check_group_size(spec.name, spec.grouped, rewards.shape[1])
    _check_finite(rewards, valid)
    return spec.outcome(rewards.to(torch.float64), valid, p, state).to(rewards.dtype)


def estimate_advantages(name: str, ctx: AdvantageContext, params=None, **overrides) -> AdvantageOutput:
    """Run the advantage estimator registered as ``name`` on ``ctx`` (its :class:`Estimator`).

    Args:
        params: an instance or mapping of the estimator's params dataclass; missing fields take
            the dataclass defaults.
        overrides: single fields replaced on top (tests: ``estimate_advantages("ppo", ctx, lam=0.8)``).

    Shapes: see :class:`AdvantageContext` -> :class:`AdvantageOutput` with
    ``advantages`` ``[B, T]`` (0 at masked positions) and, for ``ppo``,
    ``returns`` ``[B, T]``.

    Raises:
        ValueError: unknown ``name`` (lists valid names); a parameter that is not a field of
            the estimator's params (lists accepted ones); ``G < 2`` for a group estimator; step
            rewards with a mask that has holes (their indices are positions of the whole
            sequence, which packing would move); any error of :class:`Estimator`.
    """
    spec = TOKEN_ESTIMATORS.spec(name)
    estimator = Estimator(spec, spec.build(params, **overrides))
    scores = getattr(ctx, "scores", None)
    if isinstance(scores, Tensor) and scores.dim() == 2:  # a malformed context: the Estimator names it
        _check_group_size(name, spec.grouped, scores.shape[1])
    if getattr(ctx, "step_rewards", None) is not None and has_holes(ctx.mask):
        raise ValueError("step rewards (advantage=process) with tool observations are not supported: use tools=none "
                         "or an outcome estimator")
    return estimator(ctx)


__all__ = [
    "TOKEN_ESTIMATORS",
    "AdvantageContext",
    "AdvantageOutput",
    "Estimator",
    "outcome_estimator",
    "compute_advantages",
    "estimate_advantages",
    "requires_groups",
    "outcome_names",
    "float_mask",
    "broadcast",
    "left_pack_order",
]
