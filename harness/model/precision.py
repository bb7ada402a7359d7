"""Training precision: ``train.precision=fp32 | bf16-autocast | auto``.

``bf16-autocast`` is mixed precision as TRL/verl train with it: fp32 master weights and AdamW
state (``model.dtype=float32``), the forward's matmuls (attention, MLP, LM head) in bf16 under
``torch.autocast``, and everything numerically delicate in fp32: the logits are cast to fp32
before the log-softmax (:func:`harness.model.logprobs._chunk_logprobs`), so log-probs, entropies, KL
terms, ratios, advantages and the loss reduction are fp32. It covers the policy's training
forward, the old/reference log-prob forwards and the critic; rollouts run in ``model.dtype``.

``auto`` measures, it does not assume: machines of this kind differ (bf16 matmuls 4.4x faster
than fp32 on one, 100x slower on an AVX2-only one). At startup :func:`probe` times the same
forward + backward of a SmolLM2-shaped MLP block in fp32 and under bf16 autocast and
:func:`choose` takes bf16 only when it is at least ``MIN_SPEEDUP`` faster. The choice is written
into the run's config (so the record and :mod:`harness.launch.rerun` repeat it without probing again)
and the probe's figures are logged (``precision.*`` tags).

``model.dtype=float64`` (with ``train.precision=fp32``) trains in double end to end: the logits,
log-probs, losses, values, gradients and AdamW state stay float64 (:func:`upcast` keeps them),
where float32 code casts bf16/fp16 up to fp32. Same maths, rounding ~1e-16 instead of ~1e-7: the
exactness tests run in it, so a float-order difference cannot pass for a real one (or fail for one).
"""

from __future__ import annotations

import contextlib
import time

import torch

CHOICES = ("fp32", "bf16-autocast", "auto")
MIN_SPEEDUP = 1.2

LAST_PROBE: dict = {}  # the figures of the last auto choice in this process (logged by harness.run)


def upcast(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least float32: bf16/fp16 become fp32 (everything numerically delicate runs in
    fp32), float32 is returned as is and float64 stays float64 (a ``model.dtype=float64`` run
    computes its log-probs, losses and values in double, not in a silently rounded fp32)."""
    return x if x.dtype == torch.float64 else x.float()


def compute_dtype(model) -> torch.dtype:
    """The dtype of the log-probs and values computed from ``model``: float64 for a float64
    model, else float32 (:func:`upcast`)."""
    p = next(model.parameters(), None)
    return torch.float64 if p is not None and p.dtype == torch.float64 else torch.float32


def autocast(precision: str, device_type: str = "cpu"):
    """The context a forward runs in: bf16 autocast for ``bf16-autocast``, nothing for ``fp32``.

    Raises:
        ValueError: ``auto`` (resolve it with :func:`choose` first) or an unknown value.
    """
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16-autocast":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    raise ValueError(f"train.precision={precision!r}: expected 'fp32' or 'bf16-autocast' here "
                     "('auto' is resolved at startup)")


def probe(tokens: int = 256, hidden: int = 576, inner: int = 1536, min_seconds: float = 0.25,
          device: str | torch.device = "cpu") -> dict:
    """Forward + backward GFLOP/s of ``x -> down(silu(up(x)))`` (SmolLM2-135M's MLP shape) on
    ``tokens`` rows, in fp32 and under bf16 autocast, each timed over at least ``min_seconds``
    after one warm-up call, on ``device`` (the one the models train on; CUDA is synchronised
    around each timing). Returns ``{"fp32_gflops", "bf16_gflops", "speedup"}``."""
    device = torch.device(device)
    g = torch.Generator().manual_seed(0)
    up = torch.randn(inner, hidden, generator=g).to(device).requires_grad_()
    down = torch.randn(hidden, inner, generator=g).to(device).requires_grad_()
    x = torch.randn(tokens, hidden, generator=g).to(device)
    flops = 3 * 2 * 2 * tokens * hidden * inner  # two matmuls, forward + 2x backward
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def rate(mode: str) -> float:
        def once():
            with autocast(mode, device.type):
                y = torch.nn.functional.linear(torch.nn.functional.silu(torch.nn.functional.linear(x, up)), down)
            y.float().sum().backward()
        once()
        sync()
        n, t0 = 0, time.perf_counter()
        while True:
            once()
            sync()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_seconds:
                return flops * n / dt / 1e9

    def sig(x: float) -> float:  # 4 significant digits: a tiny probe's 0.05 GFLOP/s keeps its precision
        return float(f"{x:.4g}")

    fp32, bf16 = sig(rate("fp32")), sig(rate("bf16-autocast"))
    return {"fp32_gflops": fp32, "bf16_gflops": bf16, "speedup": sig(bf16 / fp32)}


def choose(figures: dict | None = None, device: str | torch.device = "cpu") -> str:
    """``bf16-autocast`` when bf16 autocast measured at least ``MIN_SPEEDUP`` x fp32, else ``fp32``.

    Args:
        figures: a :func:`probe` result (measured now on ``device`` when None); kept in ``LAST_PROBE``.
    """
    figures = dict(figures or probe(device=device))
    choice = "bf16-autocast" if figures["speedup"] >= MIN_SPEEDUP else "fp32"
    LAST_PROBE.clear()
    LAST_PROBE.update(figures, chosen=choice)
    return choice
