"""Rollout backends registered by name (:data:`BACKENDS`); ``rollout=<name>`` picks one.

Every module of this package is imported here, so a module that registers a backend (see
:mod:`harness.rollout.base`) is all it takes to add one. A backend's heavy engine (vLLM) is
imported when the backend is built, not here.
"""

from __future__ import annotations

from harness.registry import import_package_modules
from harness.rollout.base import (BACKENDS, RolloutBackend, RolloutBatch, RolloutConfig, SamplingParams,
                                  concat_batches, empty_batch)

import_package_modules(__name__)


def build_backend(name: str, model, tokenizer, **params) -> RolloutBackend:
    """The backend registered as ``name``, built with its params from ``params`` (the ``rollout``
    node's keys, or a few keyword overrides; the rest take the params dataclass's defaults).

    Raises:
        ValueError: unknown name (lists the valid ones) or a key the backend's params lack.
    """
    spec = BACKENDS.spec(name)
    return spec.fn(model, tokenizer, spec.build(params))


def eval_decode(rollout, policy) -> str:
    """What decodes a run's evals, as its ``eval.decode`` tag names it: ``rollout=<backend>, <dtype>``,
    the dtype being the backend's ``eval_dtype`` (``rollout=lean``), else its engine ``dtype``
    (``rollout=vllm``), when set to other than ``auto``, else the policy's.

    Args:
        rollout: the run's ``rollout`` config node.
        policy: the policy module.
    """
    dtype = rollout.get("eval_dtype", rollout.get("dtype", "auto"))
    if dtype == "auto":
        dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")
    return f"rollout={rollout.backend}, {dtype}"


__all__ = ["BACKENDS", "RolloutBackend", "RolloutBatch", "RolloutConfig", "SamplingParams", "build_backend",
           "concat_batches", "empty_batch", "eval_decode"]
