"""Rollout backends registered by name (``rollout.backend``)."""

from __future__ import annotations

from harness.rollout.base import RolloutBackend, RolloutBatch, SamplingParams, concat_batches

# A vLLM backend implements RolloutBackend (generate + sync_weights) and registers here.
BACKENDS = ("hf",)


def build_backend(name: str, model, tokenizer, **kwargs) -> RolloutBackend:
    """Instantiate a backend.

    Raises:
        ValueError: unknown name (lists the valid ones).
    """
    if name == "hf":
        from harness.rollout.hf import HFRollout

        return HFRollout(model, tokenizer, **kwargs)
    raise ValueError(f"rollout.backend={name!r}: expected one of {list(BACKENDS)}")


__all__ = ["RolloutBackend", "RolloutBatch", "SamplingParams", "build_backend", "concat_batches"]
