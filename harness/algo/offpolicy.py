"""The policy objective under stale rollouts (``offpolicy=<name>``): what the ratio is taken against.

Three policies meet in a stale step (``rollout.staleness=k``, :mod:`harness.train.staleness`):

* the **behaviour** policy ``pi_behav``: the weights that sampled the batch (``k`` updates old);
* the **proximal** policy ``pi_prox``: the weights before this step's update (the trainer's
  "old" log-probs: computed before the update when ``mu > 1``, else the first pass's detached
  log-probs);
* the current policy ``pi_theta``, being optimised.

On-policy (``k = 0``) the behaviour and proximal policies are the same weights, and every choice
here is the same objective up to the rollout-training mismatch. The choices:

* ``behaviour`` (the default; the harness's objective before staleness existed): the policy
  loss's ratio is ``pi_theta / pi_behav``, with ``pi_behav`` the trainer's own log-probs under the
  behaviour weights (recomputed, so at ``k = 0`` exactly the old log-probs of an on-policy run);
  ``rollout_correction=`` then weighs the trainer-vs-sampler mismatch of those same weights.
  This is PPO on stale data as AReaL runs it without its decoupled loss (``old_logprobs`` =
  ``proximal_logprobs`` = the behaviour's).
* ``decoupled``: AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL: A Large-Scale
  Asynchronous Reinforcement Learning System for Language Reasoning", eq. 5; AReaL
  ``ppo_actor_loss_fn`` with ``use_decoupled_loss``): the ratio (and its clip) is taken against
  the proximal policy, ``r_t = pi_theta / pi_prox``, and the per-token loss is multiplied by the
  importance weight ``w_t = pi_prox(y_t) / pi_behav(y_t)``. ``pi_behav``'s log-probs are the
  sampler's (AReaL's convention: the inference engine's ``old_logprobs``), so ``w`` also carries
  the rollout-training mismatch. The weight is capped in one of two ways:

  - ``rollout_correction=none``: AReaL's ``behav_imp_weight_cap``: ``w_t`` where ``w_t <= cap``,
    else 0 (the token leaves the loss); ``offpolicy.cap=null``: no cap.
  - any other ``rollout_correction=``: ``w`` is that registered correction (``token_truncate``,
    ``token_mask``, ``sequence_*``, with its own ``cap``) applied to ``log pi_prox - log pi_behav``,
    e.g. truncated IS ``min(w_t, C)`` (verl's ``rollout_is`` on the proximal-behaviour ratio);
    ``offpolicy.cap`` is then unread, and refused when set (:mod:`harness.launch.validate`).

A variant is ``fn(prox_logprobs, sampler_logprobs, mask, correction_weights, p) -> (weights or
None, stats)`` (``[B, T]`` each; ``correction_weights``: the rollout correction's weights on
``old - sampler``, or None), registered with ``needs={"proximal"}`` when its ratio is taken
against the proximal policy; the trainer reads that declaration, never the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from harness.registry import Registry
from .utils import masked_mean

OFFPOLICY_OBJECTIVES: Registry = Registry("off-policy objective")


@dataclass
class BehaviourParams:
    """``offpolicy=behaviour``: the ratio against the behaviour policy (the trainer's recomputed
    log-probs under the weights that sampled); no weight beyond ``rollout_correction``'s."""

    name: str = "behaviour"


@dataclass
class DecoupledParams:
    """``offpolicy=decoupled``: AReaL's decoupled PPO loss: the ratio against the proximal policy
    (the weights before this step's update), times the weight ``pi_prox / pi_behav``, capped by
    ``cap`` (AReaL's ``behav_imp_weight_cap``: tokens past it weigh 0), or by the registered
    ``rollout_correction=`` on that ratio when one is set."""

    name: str = "decoupled"
    # AReaL behav_imp_weight_cap (its examples use 5); null = no cap. Read only with rollout_correction=none
    cap: Optional[float] = 5.0


@OFFPOLICY_OBJECTIVES.register("behaviour", params=BehaviourParams)
def behaviour(prox_logprobs: Tensor, sampler_logprobs: Optional[Tensor], mask: Tensor,
              correction_weights: Optional[Tensor], p: BehaviourParams):
    """The policy loss's ratio is taken against the behaviour log-probs (the trainer passes them as
    the "old" log-probs); the weights are the rollout correction's, unchanged. Returns
    ``(correction_weights, {})``."""
    return correction_weights, {}


@OFFPOLICY_OBJECTIVES.register("decoupled", params=DecoupledParams, needs=("proximal",))
def decoupled(prox_logprobs: Tensor, sampler_logprobs: Optional[Tensor], mask: Tensor,
              correction_weights: Optional[Tensor], p: DecoupledParams):
    """The behaviour-to-proximal importance weight of AReaL's decoupled PPO loss.

    Args:
        prox_logprobs: ``[B, T]`` the proximal policy's log-probs (detached).
        sampler_logprobs: ``[B, T]`` the behaviour policy's, as the sampler reported them.
        mask: ``[B, T]`` float loss mask.
        correction_weights: ``[B, T]`` the registered ``rollout_correction`` applied to
            ``prox - sampler``, or None (``rollout_correction=none``).
    Returns:
        ``(w [B, T], stats)``: ``correction_weights`` when given; else ``w_t = exp(prox_t - behav_t)``
        where it is <= ``cap`` (everywhere when ``cap`` is None), else 0, and 0 off the mask (AReaL
        ``behav_imp_weight``). Stats: ``offpolicy_weight_mean`` (the mean weight over the loss
        tokens) and, with the cap, ``offpolicy_masked_frac`` (the fraction of loss tokens it dropped).
    Raises:
        ValueError: ``cap`` <= 0, or no sampler log-probs (greedy sampling).
    """
    if p.cap is not None and not p.cap > 0:
        raise ValueError(f"offpolicy.cap={p.cap}: expected a number > 0 or null (no cap)")
    if correction_weights is not None:
        return correction_weights, {"offpolicy_weight_mean": masked_mean(correction_weights, mask)}
    if sampler_logprobs is None:
        raise ValueError("offpolicy=decoupled: the rollout backend reported no sampler log-probs (greedy "
                         "sampling?); use offpolicy=behaviour")
    w = torch.exp((prox_logprobs - sampler_logprobs) * mask)
    keep = mask > 0
    if p.cap is not None:
        keep = keep & (w <= p.cap)
    w = torch.where(keep, w, torch.zeros_like(w))
    return w, {"offpolicy_weight_mean": masked_mean(w, mask),
               "offpolicy_masked_frac": masked_mean(((mask > 0) & ~keep).to(mask.dtype), mask)}


__all__ = ["OFFPOLICY_OBJECTIVES", "BehaviourParams", "DecoupledParams", "behaviour", "decoupled"]
