"""Per-token KL-divergence estimators between the policy and a reference policy.

All forms estimate ``KL(pi_theta || pi_ref)`` from tokens sampled from
``pi_theta`` using only the two log-probabilities of the sampled token
(J. Schulman, "Approximating KL Divergence", 2020,
http://joschu.net/blog/kl-approx.html). With ``log r = logref - logp``:

* ``k1 = -log r = logp - logref`` -- unbiased, high variance, can be negative.
* ``k2 = 0.5 * (log r)^2`` -- biased, low variance, always >= 0.
* ``k3 = (r - 1) - log r = exp(logref - logp) - (logref - logp) - 1`` --
  unbiased, low variance, always >= 0. DeepSeekMath (Shao et al. 2024) eq. 4
  uses this form; verl calls it ``low_var_kl``.

verl's ``kl_penalty`` names are registered as aliases: ``kl`` (k1), ``mse``
(k2), ``low_var_kl`` (k3).

Straight-through forms ``k1+`` and ``k3+`` (verl ``kl_penalty``): the value of k1 / k3 with the
gradient of k2. The expected gradient of k2 with respect to ``logp`` is the gradient of
``KL(pi_theta || pi_ref)`` on tokens sampled from ``pi_theta`` (that of k1 and k3 is not), so a
"+" form keeps the logged value an unbiased KL estimate and the update an unbiased KL gradient.

Importance correction (``kl_penalty(..., old_logprobs=...)``, ``kl.importance_correct``):
DeepSeek-V3.2's unbiased estimate for tokens sampled from ``pi_old``, the estimate times the
ratio ``pi_theta / pi_old`` (gradient through the ratio).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from harness.registry import Entry, Registry
from .utils import shape_str

KL_ESTIMATORS: Registry = Registry("KL estimator")

# Bound on |log r| before exponentiation in k3 when clamping is requested (verl).
_K3_LOG_RATIO_BOUND = 20.0


def _register(*names: str, invariances=()) -> Callable:
    def decorator(fn: Callable) -> Callable:
        for name in names:
            KL_ESTIMATORS.register(name, invariances=invariances)(fn)
        return fn

    return decorator


# Invariances (tests/test_properties.py): "zero_at_equal": logp == logref gives exactly 0;
# "nonnegative": never below 0.
@_register("k1", "kl", invariances=("zero_at_equal",))
def kl_k1(logprobs: Tensor, ref_logprobs: Tensor, clamp: Optional[float] = None) -> Tensor:
    """k1 estimator: ``logp - logref``. Shapes ``[B, T], [B, T] -> [B, T]``.

    Source: Schulman 2020 blog, k1 (naive, unbiased). ``clamp`` bounds the
    output to ``[-clamp, clamp]``.
    """
    kl = logprobs - ref_logprobs
    return kl if clamp is None else kl.clamp(-clamp, clamp)


@_register("k2", "mse", invariances=("zero_at_equal", "nonnegative"))
def kl_k2(logprobs: Tensor, ref_logprobs: Tensor, clamp: Optional[float] = None) -> Tensor:
    """k2 estimator: ``0.5 * (logp - logref)^2``. Shapes ``[B, T], [B, T] -> [B, T]``.

    Source: Schulman 2020 blog, k2 (biased, low variance). ``clamp`` bounds
    the output to ``[-clamp, clamp]``.
    """
    kl = 0.5 * (logprobs - ref_logprobs).square()
    return kl if clamp is None else kl.clamp(-clamp, clamp)


@_register("k3", "low_var_kl", invariances=("zero_at_equal", "nonnegative"))
def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, clamp: Optional[float] = None) -> Tensor:
    """k3 estimator: ``exp(logref - logp) - (logref - logp) - 1``. ``[B, T] -> [B, T]``.

    Computed as ``expm1(x) - x`` with ``x = logref - logp`` (exact same value, no cancellation
    near ``x = 0``).

    Source: Schulman 2020 blog, k3; DeepSeekMath eq. 4; verl ``low_var_kl``.
    With ``clamp`` set (verl uses 10), ``logref - logp`` is first clamped to
    ``[-20, 20]`` to avoid overflow in ``exp`` and the result is clamped to
    ``[-clamp, clamp]``; with ``clamp=None`` (default) no clamping happens.
    """
    log_r = ref_logprobs - logprobs
    if clamp is not None:
        log_r = log_r.clamp(-_K3_LOG_RATIO_BOUND, _K3_LOG_RATIO_BOUND)
    # expm1(x) - x: the same value as exp(x) - x - 1 in exact arithmetic, without the cancellation
    # of exp(x) - 1 near x = 0 (where the policy sits next to its reference); clamped at 0, the
    # exact minimum, so rounding never makes the estimate negative.
    kl = (torch.expm1(log_r) - log_r).clamp(min=0.0)
    return kl if clamp is None else kl.clamp(-clamp, clamp)


def _straight_through(value: Tensor, logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """``value`` in value, the gradient of k2 = ``0.5 (logp - logref)^2`` in the backward pass.

    Written ``(k2 - sg(k2)) + sg(value)``: the first bracket is exactly 0 in value, so the result
    equals ``value`` bit for bit (``k2 + sg(value - k2)`` would round twice).
    """
    k2 = 0.5 * (logprobs - ref_logprobs).square()
    return (k2 - k2.detach()) + value.detach()


@_register("k1+", invariances=("zero_at_equal",))
def kl_k1_st(logprobs: Tensor, ref_logprobs: Tensor, clamp: Optional[float] = None) -> Tensor:
    """k1 in value, k2's gradient (straight-through). ``[B, T], [B, T] -> [B, T]``.

    Value ``logp - logref`` (clamped as :func:`kl_k1`); gradient ``d/dlogp = logp - logref``
    (k2's, never clamped). Source: verl ``core_algos.kl_penalty`` with ``kl_loss_type="k1+"``
    (``backward_score - backward_score.detach() + forward_score.detach()``, backward k2) and
    verl PR #2953; Schulman 2020 for why k2's gradient is the KL's.
    """
    return _straight_through(kl_k1(logprobs, ref_logprobs, clamp), logprobs, ref_logprobs)


@_register("k3+", invariances=("zero_at_equal", "nonnegative"))
def kl_k3_st(logprobs: Tensor, ref_logprobs: Tensor, clamp: Optional[float] = None) -> Tensor:
    """k3 in value, k2's gradient (straight-through). ``[B, T], [B, T] -> [B, T]``.

    Value ``exp(logref - logp) - (logref - logp) - 1`` (clamped as :func:`kl_k3`); gradient
    ``d/dlogp = logp - logref`` (k2's, never clamped: verl clamps only the forward value).
    Source: verl ``core_algos.kl_penalty`` with ``kl_loss_type="k3+"`` and verl PR #2953.
    """
    return _straight_through(kl_k3(logprobs, ref_logprobs, clamp), logprobs, ref_logprobs)


# The forms whose importance-corrected estimate is unbiased in value and gradient (see kl_penalty).
IMPORTANCE_CORRECTABLE = ("k1", "kl", "k3", "low_var_kl")


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    form: str,
    *,
    clamp: Optional[float] = None,
    mask: Optional[Tensor] = None,
    old_logprobs: Optional[Tensor] = None,
) -> Tensor:
    """Per-token KL estimate between policy and reference, form chosen by name.

    Shapes: ``logprobs``, ``ref_logprobs`` (and optional ``mask``): ``[B, T]``
    log-probabilities of the sampled tokens -> ``[B, T]`` per-token estimate
    (0 at positions where ``mask == 0`` when a mask is given). Gradients flow
    through ``logprobs`` (and ``ref_logprobs`` if it requires grad).

    ``form``: one of ``KL_ESTIMATORS.names()`` -- ``k1``/``kl``, ``k2``/``mse``,
    ``k3``/``low_var_kl``, ``k1+``, ``k3+``; formulas in the module docstring (Schulman 2020).
    ``clamp``: None (default, no clamping) or a positive bound on the output
    (k3 additionally bounds the log-ratio to +-20 as verl does).

    ``old_logprobs`` (``[B, T]``, the behaviour policy that sampled the tokens; None = off):
    the importance-corrected estimate ``rho * k`` with ``rho = exp(logp - logp_old)`` (log-ratio
    clamped to +-20 as the policy losses'), the gradient flowing through ``rho``. DeepSeek-V3.2
    (arXiv 2512.02556), the "Unbiased KL Estimate" of its GRPO section: ``D_KL = pi_theta / pi_old * k3``;
    TRL ``GRPOConfig.use_bias_correction_kl`` (``trl/trainer/grpo_trainer.py``,
    ``_compute_loss``: ``per_token_kl = per_token_kl * coef_1``, ``coef_1 = exp(logp - old)``
    not detached, token level). Under samples from ``pi_old`` its value is an unbiased
    estimate of ``KL(pi_theta || pi_ref)`` for an unbiased ``k`` (``E_old[rho k] = E_theta[k]``),
    and its gradient ``rho (logp - logref) d logp`` for both k1 and k3 (k3:
    ``rho (1 - e^x) + rho k3 = rho (-x)``, ``x = logref - logp``; k1: ``rho (1 + logp - logref)``,
    whose extra ``rho d logp`` has expectation 0) is unbiased for the KL's gradient. Defined only
    for ``IMPORTANCE_CORRECTABLE`` forms (k1, k3 and their aliases): k2 is biased in value, and
    the ratio's gradient would add to a "+" form's straight-through one. On-policy
    (``old = logp.detach()``) ``rho = 1``: the value is unchanged, the gradient of k3 becomes
    ``logp - logref`` (k2's).

    Raises:
        ValueError: unknown ``form`` (lists valid names); shape mismatch between
            ``logprobs``, ``ref_logprobs``, ``old_logprobs`` and ``mask``; ``clamp <= 0``;
            ``old_logprobs`` with a form not in ``IMPORTANCE_CORRECTABLE``.
    """
    return estimate_kl(KL_ESTIMATORS.spec(form), logprobs, ref_logprobs, clamp=clamp, mask=mask,
                       old_logprobs=old_logprobs)


def estimate_kl(
    estimator: Entry,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    *,
    clamp: Optional[float] = None,
    mask: Optional[Tensor] = None,
    old_logprobs: Optional[Tensor] = None,
) -> Tensor:
    """:func:`kl_penalty` with the form already looked up (``estimator``: a ``KL_ESTIMATORS``
    record, as :class:`harness.algo.Algorithm` holds it). Shapes, arguments and errors as
    :func:`kl_penalty`."""
    form, fn = estimator.name, estimator.fn
    if not isinstance(logprobs, Tensor) or not isinstance(ref_logprobs, Tensor):
        raise ValueError("logprobs and ref_logprobs must be torch.Tensors")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs must have the shape of logprobs {shape_str(logprobs)}, "
            f"got {shape_str(ref_logprobs)}"
        )
    if clamp is not None and not clamp > 0:
        raise ValueError(f"clamp must be None or > 0, got {clamp}")
    kl = fn(logprobs, ref_logprobs, clamp=clamp)
    if old_logprobs is not None:
        if form not in IMPORTANCE_CORRECTABLE:
            raise ValueError(f"the importance-corrected KL (kl.importance_correct) is defined for the forms "
                             f"{list(IMPORTANCE_CORRECTABLE)}, not {form!r}")
        if not isinstance(old_logprobs, Tensor) or old_logprobs.shape != logprobs.shape:
            got = shape_str(old_logprobs) if isinstance(old_logprobs, Tensor) else type(old_logprobs).__name__
            raise ValueError(f"old_logprobs must have the shape of logprobs {shape_str(logprobs)}, got {got}")
        log_rho = (logprobs - old_logprobs).clamp(-_K3_LOG_RATIO_BOUND, _K3_LOG_RATIO_BOUND)
        kl = torch.exp(log_rho) * kl
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.shape != logprobs.shape:
            got = shape_str(mask) if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"mask must have the shape of logprobs {shape_str(logprobs)}, got {got}"
            )
        kl = torch.where(mask.to(torch.bool), kl, torch.zeros_like(kl))
    return kl


KL_CONTROLLERS: Registry = Registry("KL controller")


@KL_CONTROLLERS.register("fixed")
def fixed_kl_coef(beta: float, current_kl: float, n_samples: int, target: float, horizon: int) -> float:
    """``kl.controller=fixed``: the coefficient stays ``beta``."""
    return beta


@KL_CONTROLLERS.register("adaptive", needs=("target", "horizon"))
def adaptive_kl_coef(beta: float, current_kl: float, n_samples: int, target: float, horizon: int) -> float:
    """``kl.controller=adaptive``: proportional control of the KL coefficient towards ``target``.

    Formula (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", sec. 2.2;
    verl ``AdaptiveKLController``): ``e = clip(current_kl / target - 1, -0.2, 0.2)`` and
    ``beta <- max(0, beta * (1 + e * n_samples / horizon))``, with ``current_kl`` the step's
    mean per-token KL and ``n_samples`` its number of completions over all ranks (verl passes
    the batch size).

    The floor at 0 is ours: with ``n_samples / horizon > 5`` and a KL below ``0.8 * target``
    the factor ``1 + e n / horizon`` is negative, and Ziegler's / verl's update makes beta
    negative (a trajectory of verl's controller reached -0.082), which rewards moving away from
    the reference. A negative coefficient is never meaningful, so it stops at 0 (and, being
    multiplicative, stays there).

    ``current_kl`` here is the token mean over the batch (``train/kl``); verl's
    ``apply_kl_penalty`` feeds the mean over rows of each row's token mean. The two agree when
    all completions have one length; with varied lengths the row mean weighs short completions
    more (docs/knobs.md, "KL").

    Raises:
        ValueError: ``target <= 0`` or ``horizon < 1``.
    """
    if not target > 0 or horizon < 1:
        raise ValueError(f"kl.target={target}, kl.horizon={horizon}: expected target > 0 and horizon >= 1")
    err = min(max(current_kl / target - 1.0, -0.2), 0.2)
    return max(0.0, beta * (1.0 + err * n_samples / horizon))


__all__ = ["KL_ESTIMATORS", "KL_CONTROLLERS", "IMPORTANCE_CORRECTABLE", "kl_penalty", "estimate_kl", "kl_k1", "kl_k2", "kl_k3",
           "kl_k1_st", "kl_k3_st", "fixed_kl_coef", "adaptive_kl_coef"]
