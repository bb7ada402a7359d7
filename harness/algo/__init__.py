"""Core RL math for grpo-harness: advantage estimators, KL penalties, policy/value
losses and loss aggregation, each selectable by a config string through a registry.

Conventions: ``[B, T]`` token tensors (right-padded, ``mask`` = 1 at real
tokens), ``[P, G]`` prompt groups with ``B = P * G`` and group-major rows
(row ``b = p * G + g``).
"""

from .estimators import (
    TOKEN_ESTIMATORS,
    AdvantageContext,
    AdvantageOutput,
    compute_advantages,
    estimate_advantages,
    outcome_names,
    requires_groups,
)
from . import advantages, rescaled, token_estimators  # noqa: F401  (register their estimators)
from .gae import gae, reinforce_pp_returns
from .kl import KL_CONTROLLERS, KL_ESTIMATORS, kl_penalty
from .aggregation import LOSS_AGGREGATIONS, aggregate_loss, aggregation_normalizers
from .filters import GROUP_FILTERS
from .rollout_correction import ROLLOUT_CORRECTIONS, mismatch_stats
from .policy_losses import POLICY_LOSSES
from .registry import Registry
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
    "ROLLOUT_CORRECTIONS",
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
    "GROUP_FILTERS",
    "RATIO_LEVELS",
]
