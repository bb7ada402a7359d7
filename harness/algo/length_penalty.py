"""Length penalties registered by name (``length_penalty=<name>``): reward shaping applied per
prompt group before the advantage estimator sees the rewards.

Signature ``fn(rewards [P, G], output_tokens [P, G], input_tokens [P, G], turns [P, G], p) ->
shaped rewards [P, G]`` (float64 in, float64 out). ``none`` (the default) returns the rewards
unchanged. The DAPO overlong penalty is separate (``overlong.*``): it depends on one completion's
length against ``rollout.max_new_tokens``, not on its group.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from harness.registry import Registry

LENGTH_PENALTIES: Registry = Registry("length penalty")


@dataclass
class NoLengthPenaltyParams:
    """``length_penalty=none``: rewards reach the estimator as they were scored."""

    name: str = "none"


@LENGTH_PENALTIES.register("none", params=NoLengthPenaltyParams)
def no_penalty(rewards: Tensor, output_tokens: Tensor, input_tokens: Tensor, turns: Tensor,
               p: NoLengthPenaltyParams) -> Tensor:
    """The rewards unchanged. Shapes: ``[P, G]`` -> ``[P, G]``."""
    return rewards


@dataclass
class LinearLengthPenaltyParams:
    """``length_penalty=linear``: prime-rl's linear length penalty (its field names and defaults,
    ``prime_rl.configs.algorithm.LinearLengthPenaltyConfig``)."""

    name: str = "linear"
    num_output_tokens_weight: float = 0.25  # completion tokens / the group's max
    num_input_tokens_weight: float = 0.1  # prompt (context) tokens / the group's max
    num_turns_weight: float = 0.1  # turns / the group's max (1 for every single-turn completion)


def _frac(x: Tensor) -> Tensor:
    """``x / max(x over the group)``, the max clamped to >= 1 (prime-rl's ``clamp(min=1)``)."""
    return x / x.amax(dim=1, keepdim=True).clamp(min=1)


@LENGTH_PENALTIES.register("linear", params=LinearLengthPenaltyParams)
def linear(rewards: Tensor, output_tokens: Tensor, input_tokens: Tensor, turns: Tensor,
           p: LinearLengthPenaltyParams) -> Tensor:
    """prime-rl's linear length penalty (``orchestrator/algo/grpo.py``, ``length_penalty="linear"``):

        frac_i = w_out * out_i / max_g out + w_in * in_i / max_g in + w_turns * turns_i / max_g turns
        r'_i   = r_i - mean_g(r) * frac_i

    per group of ``G`` completions of one prompt (``mean_g(r)``: the group's pass rate with 0/1
    rewards), so a group that solves its prompt more often is pushed harder towards short
    completions and a group that never solves it is not penalised. Each max is clamped to >= 1.

    In a single-turn run every completion of a group shares its prompt and has one turn, so the
    input and turns terms equal ``w * mean_g(r)`` for the whole group: a constant shift, which
    leaves any shift-invariant estimator's advantages unchanged (GRPO, RLOO, Dr. GRPO) and moves
    the others' (REINFORCE without a baseline, PPO's critic targets), as in prime-rl.

    Shapes: every input ``[P, G]`` (token counts and turns as floats); returns ``[P, G]``.

    Raises:
        ValueError: a negative weight (names it), or inputs of different shapes.
    """
    for key in ("num_output_tokens_weight", "num_input_tokens_weight", "num_turns_weight"):
        if getattr(p, key) < 0:
            raise ValueError(f"length_penalty.{key} must be >= 0, got {getattr(p, key)}")
    if not rewards.shape == output_tokens.shape == input_tokens.shape == turns.shape:
        raise ValueError(f"length_penalty: rewards {tuple(rewards.shape)}, output_tokens "
                         f"{tuple(output_tokens.shape)}, input_tokens {tuple(input_tokens.shape)} and "
                         f"turns {tuple(turns.shape)} must all be [P, G]")
    frac = (p.num_output_tokens_weight * _frac(output_tokens) + p.num_input_tokens_weight * _frac(input_tokens)
            + p.num_turns_weight * _frac(turns))
    return rewards - rewards.mean(dim=1, keepdim=True) * frac


__all__ = ["LENGTH_PENALTIES", "no_penalty", "linear", "NoLengthPenaltyParams", "LinearLengthPenaltyParams"]
