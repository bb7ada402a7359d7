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


__all__ = ["BACKENDS", "RolloutBackend", "RolloutBatch", "RolloutConfig", "SamplingParams", "build_backend",
           "concat_batches", "empty_batch"]
