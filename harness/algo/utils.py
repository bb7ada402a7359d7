"""Masked tensor statistics and evaluation helpers shared by ``harness.algo``.

Shapes: ``[B, T]`` is a batch of B completions padded to T tokens; ``mask`` is 1
(or True) at real tokens and 0 at padding. Masks may be bool or float; a float
mask acts as per-element weights. Positions where ``mask == 0`` never
contribute, even if ``x`` holds NaN/inf there.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

Dim = Optional[Union[int, Sequence[int]]]


def _check_same_shape(x: Tensor, mask: Tensor, x_name: str = "x") -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{x_name} must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if x.shape != mask.shape:
        raise ValueError(
            f"mask must have the same shape as {x_name}: expected {tuple(x.shape)}, "
            f"got {tuple(mask.shape)}"
        )


def _weights(x: Tensor, mask: Tensor) -> Tensor:
    """Mask as weights in x's floating dtype."""
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    return mask.to(dtype)


def masked_sum(x: Tensor, mask: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """Sum of ``x * mask`` over ``dim`` (all elements when ``dim`` is None).

    Shapes: ``x`` and ``mask`` identical (typically ``[B, T]``); result has ``dim``
    reduced (0-dim when ``dim`` is None).

    Formula: ``sum_i m_i x_i``; masked-out elements are replaced by 0 before the
    product so NaN/inf padding does not leak.

    Raises:
        ValueError: if ``mask`` does not have the same shape as ``x``.
    """
    _check_same_shape(x, mask)
    w = _weights(x, mask)
    prod = torch.where(w != 0, x * w, torch.zeros((), dtype=w.dtype, device=x.device))
    if dim is None:
        return prod.sum()
    return prod.sum(dim=dim, keepdim=keepdim)


def _count(x: Tensor, mask: Tensor, dim: Dim, keepdim: bool) -> Tensor:
    w = _weights(x, mask)
    return w.sum() if dim is None else w.sum(dim=dim, keepdim=keepdim)


def masked_mean(x: Tensor, mask: Tensor, dim: Dim = None, keepdim: bool = False) -> Tensor:
    """Mean of ``x`` over the elements selected by ``mask``.

    Shapes: ``x`` and ``mask`` identical (typically ``[B, T]``); result has ``dim``
    reduced (0-dim when ``dim`` is None).

    Formula: ``sum_i m_i x_i / sum_i m_i``. Convention: a slice with no selected
    element has mean 0 (not NaN) -- verl uses ``/(sum m + 1e-8)`` to the same effect.

    Raises:
        ValueError: if ``mask`` does not have the same shape as ``x``.
    """
    s = masked_sum(x, mask, dim=dim, keepdim=keepdim)
    n = _count(x, mask, dim, keepdim)
    return torch.where(n > 0, s / torch.where(n > 0, n, torch.ones_like(n)), torch.zeros_like(s))


def masked_var(
    x: Tensor, mask: Tensor, unbiased: bool = True, dim: Dim = None, keepdim: bool = False
) -> Tensor:
    """Variance of ``x`` over the elements selected by ``mask``.

    Shapes: as :func:`masked_mean`.

    Formula: ``v = sum_i m_i (x_i - mu)^2 / N`` with ``mu`` the masked mean and
    ``N = sum_i m_i``; if ``unbiased`` (Bessel), ``v * N / (N - 1)``.
    Convention: where ``N < 2`` (unbiased) or ``N == 0`` (population) the
    variance is undefined and 0 is returned instead of NaN/inf.

    Raises:
        ValueError: if ``mask`` does not have the same shape as ``x``.
    """
    mu = masked_mean(x, mask, dim=dim, keepdim=True)
    sq = (x - mu) ** 2
    var = masked_mean(sq, mask, dim=dim, keepdim=keepdim)
    n = _count(x, mask, dim, keepdim)
    if unbiased:
        ok = n > 1
        factor = n / torch.where(ok, n - 1, torch.ones_like(n))
        return torch.where(ok, var * factor, torch.zeros_like(var))
    return var


def masked_whiten(
    x: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8, unbiased: bool = True
) -> Tensor:
    """Whiten ``x`` with statistics over all selected elements (the whole batch).

    Shapes: ``x``, ``mask``: ``[B, T]`` (any identical shape) -> ``[B, T]``.

    Formula: ``(x - mu) / sqrt(var + eps)``; with ``shift_mean=False`` the mean is added
    back, ``(x - mu) / sqrt(var + eps) + mu``. Masked-out positions are set to 0.
    ``unbiased=True``: Bessel-corrected variance (verl ``masked_whiten``);
    ``unbiased=False``: population variance (OpenRLHF ``masked_normalize``).

    Raises:
        ValueError: if ``mask`` does not have the same shape as ``x`` or ``eps < 0``.
    """
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    mu = masked_mean(x, mask)
    var = masked_var(x, mask, unbiased=unbiased)
    out = (x - mu) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mu
    return torch.where(mask.to(torch.bool), out, torch.zeros_like(out))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    Formula (Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code", eq. 1 and its numerically stable implementation in fig. 3):
    ``pass@k = 1 - C(n-c, k) / C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k / i)``,
    and exactly 1.0 when ``n - c < k``.

    Raises:
        ValueError: if any argument is not an int, ``n < 1``, ``c`` is not in
            ``[0, n]``, or ``k`` is not in ``[1, n]``.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name} must be an int, got {v!r}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not 0 <= c <= n:
        raise ValueError(f"c must be in [0, n={n}], got {c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def maj_at_k(answers: Sequence[Optional[str]], correct: Sequence[bool], k: int) -> float:
    """Unbiased maj@k from ``n`` samples of one problem: the expected correctness of the majority
    vote over ``k`` of the samples drawn without replacement (the vote of every k-subset,
    averaged exactly), so that maj@k for k < n does not depend on which k were kept.

    Votes: samples with the same extracted answer string vote together; a sample with no answer
    (``None``) abstains. The winner is the answer with the most votes; a tie between t answers is
    broken uniformly at random (credit = correct answers among the tied / t); a subset in which
    no sample answered scores 0. An answer is correct when one of its samples was judged correct
    (the verifier's verdict; equal strings get equal verdicts unless a check timed out).
    Answers are compared as the verifier extracted them, so two equivalent strings (``8`` and
    ``8.0``) split their votes.

    Formula: with c_a samples per answer a and x_a of them drawn (multivariate hypergeometric),
    ``maj@k = sum_{a correct} sum_{j>=1} C(c_a, j) W_a(j) / C(n, k)``, where ``W_a(j)`` sums
    ``prod_{b != a} C(c_b, x_b) / (1 + #{b: x_b = j})`` over the other answers' draws with every
    ``x_b <= j`` and ``sum x_b = k - j`` (abstainers included, unconstrained), computed by dynamic
    programming over the answers in exact integer arithmetic. k = 1 gives the fraction of samples
    correct (mean@n); k = n the plain majority vote of all samples. Unbiased for the vote of k
    fresh samples, as pass@k's estimator is (Chen et al. 2021).

    Peer: verl (``trainer/ppo/metric_utils.py``: ``bootstrap_metric`` + ``calc_maj_val``)
    estimates maj@k from 1000 draws of k samples *with* replacement and breaks a tie by the answer
    seen first; this exact without-replacement average has no Monte-Carlo noise and no dependence
    on sample order, and gives the same value at k = n when the vote has no tie.

    Args:
        answers: ``[n]`` extracted answers (None: no answer).
        correct: ``[n]`` verdicts.
        k: votes per subset, 1 <= k <= n.
    Raises:
        ValueError: ``answers`` and ``correct`` differ in length, n = 0, or k not in [1, n].
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"answers ({n}) and correct ({len(correct)}) differ in length")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= n:
        raise ValueError(f"k must be an int in [1, n={n}], got {k!r}")
    counts: dict[str, int] = {}
    right: set[str] = set()
    for a, ok in zip(answers, correct):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        if ok:
            right.add(a)
    abstain = n - sum(counts.values())
    total = Fraction(0)
    for a in right:
        others = [c for b, c in counts.items() if b != a]
        for j in range(1, min(counts[a], k) + 1):
            # dp[(s, t)]: ways the other answers draw s samples, all <= j, t of them exactly j
            dp = {(0, 0): 1}
            for c in others:
                nxt: dict[tuple[int, int], int] = {}
                for (s, t), ways in dp.items():
                    for x in range(0, min(c, j, k - j - s) + 1):
                        key = (s + x, t + (x == j))
                        nxt[key] = nxt.get(key, 0) + ways * math.comb(c, x)
                dp = nxt
            w = sum(Fraction(ways * math.comb(abstain, k - j - s), 1 + t) for (s, t), ways in dp.items())
            total += math.comb(counts[a], j) * w
    return float(total / math.comb(n, k))


def explained_variance(
    y_pred: Tensor, y_true: Tensor, mask: Optional[Tensor] = None
) -> float:
    """Fraction of the variance of ``y_true`` explained by ``y_pred`` (critic diagnostic).

    Shapes: ``y_pred``, ``y_true`` (and ``mask``) identical, e.g. ``[B, T]``
    values and returns.

    Formula (OpenAI baselines / CleanRL): ``1 - Var[y_true - y_pred] / Var[y_true]``
    with population variances over the masked elements. Returns ``nan`` when
    ``Var[y_true] == 0`` (as CleanRL does); 1 = perfect, 0 = no better than the mean.

    Raises:
        ValueError: if shapes differ.
    """
    _check_same_shape(y_true, y_pred, "y_true")
    if mask is None:
        mask = torch.ones_like(y_true, dtype=torch.bool)
    _check_same_shape(y_true, mask, "y_true")
    y_true = y_true.detach().to(torch.float64)
    y_pred = y_pred.detach().to(torch.float64)
    var_y = float(masked_var(y_true, mask, unbiased=False))
    if var_y == 0.0:
        return math.nan
    return 1.0 - float(masked_var(y_true - y_pred, mask, unbiased=False)) / var_y


def right_padded_lengths(mask: Tensor) -> Tensor:
    """Per-row number of valid tokens of a right-padded ``[B, T]`` mask -> ``[B]`` long.

    Raises:
        ValueError: if ``mask`` is not 2-D or is not right-padded (a valid token
            after a padding token in some row).
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise ValueError(
            f"mask must be a [B, T] tensor, got "
            f"{tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__}"
        )
    m = mask.to(torch.bool)
    if m.shape[1] > 1 and bool((m[:, 1:] & ~m[:, :-1]).any()):
        raise ValueError(
            "mask must be right-padded: 1 for the first L_b tokens of each row, then 0"
        )
    return m.sum(dim=-1)


def check_like(ref: Tensor, ref_name: str, **tensors: Tensor) -> None:
    """Raise ValueError unless ``ref`` is ``[B, T]`` and every tensor in ``tensors`` has its shape."""
    if not isinstance(ref, Tensor) or ref.dim() != 2:
        got = shape_str(ref) if isinstance(ref, Tensor) else type(ref).__name__
        raise ValueError(f"{ref_name} must be a [B, T] tensor, got {got}")
    for name, t in tensors.items():
        if not isinstance(t, Tensor) or t.shape != ref.shape:
            got = shape_str(t) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(
                f"{name} must have the shape of {ref_name} {shape_str(ref)}, got {got}"
            )


def zero_masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with 0 where ``mask == 0`` (``where``: NaN / inf padding reaches neither values nor gradients)."""
    return torch.where(mask.to(torch.bool), x, torch.zeros_like(x))


def shape_str(t: Tensor) -> str:
    """``[2, 3]``-style shape string for error messages."""
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


__all__: Tuple[str, ...] = (
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "pass_at_k",
    "explained_variance",
    "right_padded_lengths",
    "shape_str",
    "check_like",
    "zero_masked",
)
