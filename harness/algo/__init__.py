"""Core RL math for grpo-harness: advantage estimators, KL penalties, policy/value
losses and loss aggregation, each selectable by a config string through a registry, and the
:class:`Algorithm` a run builds from them once (:mod:`.algorithm`).

One module per concept: the estimator registry (:mod:`.estimators`) with the outcome estimators
(:mod:`.advantages`, :mod:`.rescaled`) and the token-level ones (:mod:`.token_estimators`);
the policy losses (:mod:`.policy_losses`, sharing the clipped surrogate of :mod:`.surrogate`);
the aggregations (:mod:`.aggregation`); the KL estimators and controllers (:mod:`.kl`); the
rollout corrections (:mod:`.rollout_correction`); the group filters (:mod:`.filters`); the
critic's value loss (:mod:`.value_loss`) and GAE (:mod:`.gae`).

Conventions: ``[B, T]`` token tensors (right-padded, ``mask`` = 1 at real
tokens), ``[P, G]`` prompt groups with ``B = P * G`` and group-major rows
(row ``b = p * G + g``).
"""

from .estimators import (
    TOKEN_ESTIMATORS,
    AdvantageContext,
    AdvantageOutput,
    Estimator,
    compute_advantages,
    estimate_advantages,
    outcome_names,
    requires_groups,
)
from . import advantages, rescaled, token_estimators  # noqa: F401  (register their estimators)
from .aggregation import LOSS_AGGREGATIONS, aggregate_loss, aggregation_normalizers
from .algorithm import Algorithm, KLTerm, LogprobForward, build_algorithm, dry_run
from .entropy import ENTROPY_CONTROLLERS
from .filters import GROUP_FILTERS
from .length_penalty import LENGTH_PENALTIES
from .adv_transforms import ADVANTAGE_TRANSFORMS
from .gae import gae, reinforce_pp_returns
from .kl import KL_CONTROLLERS, KL_ESTIMATORS, kl_penalty
from .offpolicy import OFFPOLICY_OBJECTIVES
from .policy_losses import POLICY_LOSSES
from harness.registry import Choice, Registry
from .rollout_correction import ROLLOUT_CORRECTIONS, mismatch_stats
from .surrogate import RATIO_LEVELS, policy_loss
from .utils import (
    explained_variance,
    masked_mean,
    masked_sum,
    masked_var,
    maj_at_k,
    masked_whiten,
    pass_at_k,
)
from .value_loss import value_loss

__all__ = [
    "Algorithm",
    "Choice",
    "Estimator",
    "KLTerm",
    "LogprobForward",
    "build_algorithm",
    "dry_run",
    "ROLLOUT_CORRECTIONS",
    "OFFPOLICY_OBJECTIVES",
    "mismatch_stats",
    "compute_advantages",
    "estimate_advantages",
    "AdvantageContext",
    "AdvantageOutput",
    "gae",
    "reinforce_pp_returns",
    "kl_penalty",
    "policy_loss",
    "aggregate_loss",
    "aggregation_normalizers",
    "value_loss",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "explained_variance",
    "pass_at_k",
    "maj_at_k",
    "requires_groups",
    "outcome_names",
    "Registry",
    "TOKEN_ESTIMATORS",
    "KL_ESTIMATORS",
    "KL_CONTROLLERS",
    "LOSS_AGGREGATIONS",
    "POLICY_LOSSES",
    "ENTROPY_CONTROLLERS",
    "GROUP_FILTERS",
    "LENGTH_PENALTIES",
    "ADVANTAGE_TRANSFORMS",
    "RATIO_LEVELS",
]
