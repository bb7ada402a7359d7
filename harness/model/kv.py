"""Key/value-cache helpers shared by the rollout prefill and the training forward.

A GRPO group repeats its prompt G times: both the sampler (:mod:`harness.rollout.hf`) and the
log-prob forward (:mod:`harness.model.logprobs`) run each distinct prompt once and gather its cache to
the rows that repeat it. Neither imports the other; both import this module.
"""

from __future__ import annotations

import functools
import inspect

import torch


def prompt_groups(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows that share the same prompt (a GRPO group repeats its prompt G times).

    Args:
        prompt_ids, prompt_mask: ``[B, Tp]`` left-padded.
    Returns:
        ``(first [U], inverse [B])``: ``first[u]`` is the first row holding unique prompt ``u``;
        row ``b`` holds prompt ``inverse[b]`` (so ``prompt_ids[first][inverse] == prompt_ids``).
    """
    key = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def prompt_cache(module, prompt_ids, prompt_mask, rows, **kwargs):
    """Run ``module`` once over distinct prompts and gather its key/value cache to ``rows``.

    Shared by the rollout prefill (:class:`harness.rollout.hf.HFRollout`) and the training
    forward (:func:`shared_prefix_hidden`). Positions are ``cumsum(mask) - 1``, as in
    :func:`build_inputs` and transformers ``generate``.

    Args:
        module: a transformers model or backbone accepting ``use_cache``.
        prompt_ids, prompt_mask: ``[U, Tp]`` left-padded distinct prompts.
        rows: ``[B]`` long tensor, the prompt of each output row (gradients sum over repeats).
        **kwargs: passed to ``module`` (e.g. ``logits_to_keep=1``).
    Returns:
        ``(output, cache)``: the module output over the U prompts and a transformers ``Cache``
        of B rows, or ``None`` for the cache when the module returns none that is batch-selectable.
    """
    mask = prompt_mask.long()
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)
    out = module(input_ids=prompt_ids, attention_mask=mask, position_ids=pos, use_cache=True, **kwargs)
    cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    if not hasattr(cache, "batch_select_indices"):
        return out, None
    cache.batch_select_indices(rows)
    return out, cache


@functools.cache
def cache_kwarg(module_type: type) -> str:
    """The name ``module_type.forward`` takes a cache under: ``cache`` (transformers >= 5.2x)
    or ``past_key_values`` (earlier)."""
    return "cache" if "cache" in inspect.signature(module_type.forward).parameters else "past_key_values"
