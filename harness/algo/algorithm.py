"""The algorithm of a run, built once from the config at startup.

:func:`build_algorithm` looks every configured variant up in its registry and builds its params
dataclass once: the advantage estimator (``advantage=``), the policy loss (``policy_loss=``),
the aggregation (``loss_agg=``), the KL estimator and controller (``kl.*``, ``beta``), the
rollout correction (``rollout_correction=``) and the group filter (``group_filter=``), with
the few scalars the loss reads. The trainer, the update, the reward shaping and the
validation's dry run (:func:`dry_run`) take the :class:`Algorithm` (or the piece they need),
never the run's config::

    algo = build_algorithm(cfg)
    adv = algo.estimator(ctx)                     # harness.algo.estimators.Estimator
    per_token, stats = algo.policy_loss(logp, old, adv.advantages, mask, weights=None)

Nothing here names a variant: what a variant declares (``needs``, ``grouped``, the
aggregation its paper prescribes) is read from its registry record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch import Tensor

from harness.model.truncation import SamplingFilter
from harness.registry import Choice, Entry

from .aggregation import LOSS_AGGREGATIONS, apply_aggregation
from .estimators import TOKEN_ESTIMATORS, AdvantageContext, Estimator
from .entropy import ENTROPY_CONTROLLERS
from .adv_transforms import ADVANTAGE_TRANSFORMS
from .filters import GROUP_FILTERS
from .length_penalty import LENGTH_PENALTIES
from .offpolicy import OFFPOLICY_OBJECTIVES
from .kl import KL_CONTROLLERS, KL_ESTIMATORS, estimate_kl
from .policy_losses import POLICY_LOSSES
from .rollout_correction import ROLLOUT_CORRECTIONS


@dataclass(frozen=True)
class KLTerm:
    """The KL(pi || pi_ref) term (``kl.*`` and ``beta``; :mod:`harness.algo.kl`).

    Attributes:
        estimator: the ``KL_ESTIMATORS`` record of ``kl.form`` (k1, k2, k3, ...).
        clamp: bound on the per-token estimate, or None.
        placement: ``loss`` (added to the per-token loss), ``reward`` (subtracted from the
            rewards before the advantages) or ``none``.
        importance_correct: multiply the loss's estimate by ``pi_theta / pi_old`` (DeepSeek-V3.2).
        beta: the starting coefficient; ``controller`` moves it from step to step.
        controller: the ``KL_CONTROLLERS`` record of ``kl.controller``; ``target`` and
            ``horizon`` are its arguments.
        ref_refresh_steps: copy the policy into the reference every N steps (0 = never).
    """

    estimator: Entry
    clamp: Optional[float]
    placement: str
    importance_correct: bool
    beta: float
    controller: Entry
    target: float
    horizon: int
    ref_refresh_steps: int

    @property
    def uses_ref(self) -> bool:
        """True when a reference model is needed (``beta > 0`` and the KL enters somewhere)."""
        return self.beta > 0 and self.placement != "none"

    def penalty(self, logprobs: Tensor, ref_logprobs: Tensor, old_logprobs: Optional[Tensor] = None) -> Tensor:
        """``[B, T]`` per-token estimate of ``kl.form`` (clamped by ``kl.clamp``); with
        ``kl.importance_correct`` and ``old_logprobs`` given, times ``pi_theta / pi_old``
        (:func:`harness.algo.kl.kl_penalty`)."""
        return estimate_kl(self.estimator, logprobs, ref_logprobs, clamp=self.clamp,
                           old_logprobs=old_logprobs if self.importance_correct else None)

    def next_beta(self, beta: float, current_kl: float, n_samples: int) -> float:
        """The coefficient of the next step, from this step's mean KL over ``n_samples`` completions."""
        return self.controller.fn(beta, current_kl, n_samples, self.target, self.horizon)


@dataclass(frozen=True)
class LogprobForward:
    """How the update computes the policy's log-probs (``rollout.temperature`` and ``keep``, the
    sampler's truncation ``rollout.top_k`` / ``rollout.top_p``: the distribution the tokens were
    sampled from; ``train.logprob_chunk``, ``train.share_prefix``, ``train.precision``: exact
    reorganisations of the same numbers)."""

    temperature: float
    chunk: int
    share_prefix: bool
    precision: str
    keep: SamplingFilter = SamplingFilter()


@dataclass(frozen=True)
class Algorithm:
    """Everything the data path reads about the algorithm, looked up and built once.

    Attributes:
        estimator: ``advantage=``: ``estimator(ctx) -> AdvantageOutput`` (:class:`harness.algo.estimators.Estimator`).
        advantage_transform: ``advantage_transform=``: ``(advantages [B, T]) -> [B, T]``, applied to
            the estimator's advantages before the policy loss (the identity for ``none``).
        policy_loss: ``policy_loss=``: ``policy_loss(logp, old, adv, mask, weights=None) -> (loss [B, T], stats)``.
        aggregation: ``loss_agg=``: applied by :func:`harness.train.update.aggregate`.
        max_len: the generation cap ``rollout.max_new_tokens`` (Dr. GRPO's default constant).
        kl: the KL term (:class:`KLTerm`).
        rollout_correction: ``rollout_correction=``: ``(log_ratio, mask, **needs) -> weights or None``
            (``needs``: ``advantages``, ``current_log_ratio``, as the variant declares).
        offpolicy: ``offpolicy=``: the objective under stale rollouts, ``(prox, sampler, mask,
            correction_weights) -> (weights or None, stats)`` (:mod:`harness.algo.offpolicy`).
        group_filter: ``group_filter=``: ``(rewards [P, G]) -> keep [P]``; ``params.max_rounds``.
        length_penalty: ``length_penalty=``: ``(rewards, output_tokens, input_tokens, turns)``, each
            ``[P, G]`` -> shaped rewards ``[P, G]`` (the identity for ``none``).
        top_entropy_quantile: the policy loss is kept on the top q of tokens by entropy.
        entropy_coef: weight of the entropy bonus (the starting one when ``entropy_control`` moves it).
        entropy_control: ``entropy_control=``: ``(coef, entropy) -> next coef``; ``params.applies(last_entropy)``.
        mu: optimisation passes per rollout batch.
        forward: how the log-probs are computed (:class:`LogprobForward`).
    """

    estimator: Estimator
    advantage_transform: Choice
    policy_loss: Choice
    aggregation: Choice
    max_len: int
    kl: KLTerm
    rollout_correction: Choice
    offpolicy: Choice
    group_filter: Choice
    length_penalty: Choice
    top_entropy_quantile: float
    entropy_coef: float
    entropy_control: Choice
    mu: int
    forward: LogprobForward

    def needs(self, what: str) -> bool:
        """True if the estimator declares it needs ``what`` (``values``, ``step_rewards``, ``greedy``)."""
        return what in self.estimator.spec.needs

    @property
    def ratio_against_proximal(self) -> bool:
        """True when the policy loss's ratio is taken against the proximal policy (the weights before
        this step's update) rather than the behaviour policy (``offpolicy=``'s declaration)."""
        return "proximal" in self.offpolicy.spec.needs

    @property
    def needs_old_logprobs(self) -> bool:
        """True when the behaviour policy's log-probs are computed before the update: several
        passes (``mu > 1``) or a KL placed in the reward (taken at the behaviour policy)."""
        return self.mu > 1 or (self.kl.uses_ref and self.kl.placement == "reward")


def build_algorithm(cfg: Any) -> Algorithm:
    """The :class:`Algorithm` of the run config ``cfg`` (a resolved :class:`harness.launch.config.Config`).

    Raises:
        ValueError: an unknown variant name (lists the valid ones) or a key that is not a
            field of the variant's params.
    """
    kl = cfg.kl
    return Algorithm(
        estimator=Estimator.build(TOKEN_ESTIMATORS, cfg.advantage),
        advantage_transform=Choice.build(ADVANTAGE_TRANSFORMS, cfg.advantage_transform),
        policy_loss=Choice.build(POLICY_LOSSES, cfg.policy_loss),
        aggregation=Choice.build(LOSS_AGGREGATIONS, cfg.loss_agg),
        max_len=cfg.rollout.max_new_tokens,
        kl=KLTerm(estimator=KL_ESTIMATORS.spec(kl.form), clamp=kl.clamp, placement=kl.placement,
                  importance_correct=bool(kl.importance_correct), beta=cfg.beta,
                  controller=KL_CONTROLLERS.spec(kl.controller), target=kl.target, horizon=kl.horizon,
                  ref_refresh_steps=kl.ref_refresh_steps),
        rollout_correction=Choice.build(ROLLOUT_CORRECTIONS, cfg.rollout_correction),
        offpolicy=Choice.build(OFFPOLICY_OBJECTIVES, cfg.offpolicy),
        group_filter=Choice.build(GROUP_FILTERS, cfg.group_filter),
        length_penalty=Choice.build(LENGTH_PENALTIES, cfg.length_penalty),
        top_entropy_quantile=cfg.top_entropy_quantile,
        entropy_coef=cfg.entropy_coef,
        entropy_control=Choice.build(ENTROPY_CONTROLLERS, cfg.entropy_control),
        mu=cfg.mu,
        forward=LogprobForward(temperature=cfg.rollout.temperature, chunk=cfg.train.logprob_chunk,
                               share_prefix=cfg.train.share_prefix, precision=cfg.train.precision,
                               keep=SamplingFilter(top_k=cfg.rollout.top_k, top_p=cfg.rollout.top_p)),
    )


def dry_run(algo: Algorithm, group_size: int) -> None:  # cpu: a synthetic host batch: it checks params, not devices
    """Run every piece of ``algo`` once on a synthetic batch of 2 prompts x ``group_size``
    completions of 3 tokens: the estimator (with the inputs it declares it needs), the policy
    loss, the aggregation, the group filter, the length penalty, the KL and entropy controllers and
    the rollout correction.

    Every check a variant makes of its own params (``advantage.scale=global``,
    ``advantage.baseline=median``, ...) then fails before any model is loaded, with the
    variant's own message; the valid values are written down once, in the variant.

    Raises:
        ValueError: the first piece that refuses its params.
    """
    G = max(int(group_size), 1)
    mask = torch.ones(2 * G, 3)
    scores = torch.arange(2 * G, dtype=torch.float32).view(2, G) % 2
    token_rewards = torch.zeros(2 * G, 3)
    token_rewards[:, -1] = scores.reshape(-1)
    ctx = AdvantageContext(scores=scores, token_rewards=token_rewards, mask=mask,
                           values=torch.zeros(2 * G, 3) if algo.needs("values") else None,
                           step_rewards=[[(2, 1.0)]] * (2 * G) if algo.needs("step_rewards") else None,
                           greedy_scores=torch.tensor([0.5, 0.0]) if algo.needs("greedy") else None,
                           reward_components=torch.stack([scores, 1 - scores], -1) if algo.needs("reward_components") else None,
                           reward_weights=torch.ones(2) if algo.needs("reward_components") else None)
    logp = -torch.rand(2 * G, 3, generator=torch.Generator().manual_seed(0)) - 0.1
    adv = algo.advantage_transform(algo.estimator(ctx).advantages)
    algo.policy_loss(logp.requires_grad_(), logp.detach() - 0.05, adv, mask)
    apply_aggregation(algo.aggregation.spec, algo.aggregation.params, torch.ones(2 * G, 3), mask,
                      max_len=algo.max_len)
    algo.group_filter(scores)
    lengths = torch.full((2, G), 3.0, dtype=torch.float64)
    algo.length_penalty(scores.double(), lengths, lengths, torch.ones(2, G, dtype=torch.float64))
    algo.kl.next_beta(1.0, 0.1, 1)
    algo.entropy_control(algo.entropy_coef, 0.1)
    inputs = {"advantages": adv, "current_log_ratio": torch.zeros(2 * G, 3)}  # what a correction may declare it needs
    weights = algo.rollout_correction(torch.zeros(2 * G, 3), mask,
                                      **{k: v for k, v in inputs.items() if k in algo.rollout_correction.spec.needs})
    algo.offpolicy(logp.detach(), logp.detach() - 0.05, mask, weights)


__all__ = ["Algorithm", "KLTerm", "LogprobForward", "build_algorithm", "dry_run"]
