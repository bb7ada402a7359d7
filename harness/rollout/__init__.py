"""Rollout backends registered by name (``rollout.backend``)."""

from __future__ import annotations

import importlib

from harness.rollout.base import RolloutBackend, RolloutBatch, SamplingParams, concat_batches, empty_batch

# name -> "module:class"; a backend implements RolloutBackend (generate + sync_weights).
BACKENDS = {"hf": "harness.rollout.hf:HFRollout", "vllm": "harness.rollout.vllm:VLLMRollout"}


def build_backend(name: str, model, tokenizer, **kwargs) -> RolloutBackend:
    """Instantiate the backend registered as ``name`` (imported on first use).

    Raises:
        ValueError: unknown name (lists the valid ones).
    """
    if name not in BACKENDS:
        raise ValueError(f"rollout.backend={name!r}: expected one of {sorted(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    # dynamic by design: a backend's module (and vllm with it) is imported only when it is chosen
    return getattr(importlib.import_module(module), cls)(model, tokenizer, **kwargs)


__all__ = ["RolloutBackend", "RolloutBatch", "SamplingParams", "build_backend", "concat_batches", "empty_batch"]
