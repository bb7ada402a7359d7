"""Per-token log-probabilities of completions under a causal LM, without full-batch logits.

Training forward passes rebuild exactly what sampling saw: the left-padded prompt followed
by the completion, the same attention mask and the same position ids (``cumsum(mask) - 1``,
as transformers ``generate`` computes them), and logits divided by the sampling temperature,
so that on-policy the ratio pi/pi_old is exactly 1.

Memory: the ``[B, T, V]`` logits tensor (49,152 x 4 bytes per token for SmolLM2) is never
built for the whole batch. The LM head runs over chunks of ``chunk`` tokens under activation
checkpointing, so each chunk's logits live only while that chunk is processed (forward and
again in backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from harness.kv import cache_kwarg, prompt_cache, prompt_groups
from harness.precision import upcast
from harness.truncation import SamplingFilter, truncate_logits


def build_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Concatenate prompt and completion.

    Args:
        prompt_ids, prompt_mask: ``[B, Tp]`` left-padded.
        completion_ids, completion_mask: ``[B, Tc]`` right-padded.
    Returns:
        ``input_ids [B, Tp+Tc]``, ``attention_mask [B, Tp+Tc]``, ``position_ids [B, Tp+Tc]``.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def backbone(model):
    """The transformer body of a ``*ForCausalLM`` (``model.model`` for Llama/Qwen)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.base_model


def completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *, share_prefix: bool = False):
    """Hidden states that predict each completion token.

    Args:
        model: a ``*ForCausalLM``.
        prompt_ids, prompt_mask: ``[B, Tp]`` left-padded.
        completion_ids, completion_mask: ``[B, Tc]`` right-padded.
        share_prefix: run each distinct prompt once and reuse its keys/values for every row
            that repeats it (see :func:`shared_prefix_hidden`); same result up to float rounding.
            ``"always"``: take that two-forward path even when no prompt repeats.
    Returns:
        ``[B, Tc, H]``: the state at position ``Tp - 1 + t`` predicts completion token ``t``.
    """
    if share_prefix:
        first, inverse = prompt_groups(prompt_ids, prompt_mask)
        body = backbone(model)
        # transformers turns the cache off under gradient checkpointing in training mode
        checkpointed = getattr(body, "gradient_checkpointing", False) and body.training and torch.is_grad_enabled()
        # "always": the shared path even when no prompt repeats (FSDP2: every rank's micro-batch must
        # run the same forwards, whose all-gathers are collectives; harness.distributed)
        if (len(first) < len(inverse) or share_prefix == "always") and not checkpointed:
            return shared_prefix_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                        first, inverse)
    input_ids, attention_mask, position_ids = build_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask)
    out = backbone(model)(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=position_ids, use_cache=False)
    tp = prompt_ids.shape[1]
    return out.last_hidden_state[:, tp - 1 : -1]


def shared_prefix_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, first, inverse):
    """:func:`completion_hidden` with one forward per distinct prompt instead of one per row.

    The U distinct prompts ``[U, Tp]`` run once with ``use_cache=True``; their key/value cache
    is gathered to the B rows (``cache.batch_select_indices(inverse)``, differentiable, so the
    prompt's gradient is the sum over the rows that reuse it), and the completions ``[B, Tc]``
    run on top of it with the same attention mask and position ids as the full forward.
    Prompt tokens only attend to earlier prompt tokens in a causal LM, so this is exact; it
    saves ``(B - U) x Tp`` tokens of forward and backward: the training-side counterpart of the
    prefix caching that inference engines use for repeated prompts (vLLM's automatic prefix
    caching).

    Args:
        first, inverse: from :func:`prompt_groups`.
    Returns:
        ``[B, Tc, H]`` as :func:`completion_hidden`.
    Raises:
        TypeError: the model's cache has no ``batch_select_indices`` (not a transformers cache).
    """
    body = backbone(model)
    out, cache = prompt_cache(body, prompt_ids[first], prompt_mask[first], inverse)
    if cache is None:
        raise TypeError(f"share_prefix needs a transformers Cache from {type(body).__name__}")
    mask = torch.cat([prompt_mask, completion_mask], dim=1).long()
    pos = (mask.cumsum(dim=1) - 1).clamp(min=0)[:, prompt_ids.shape[1]:]
    out_c = body(input_ids=completion_ids, attention_mask=mask, position_ids=pos, use_cache=True,
                 **{cache_kwarg(type(body)): cache})
    last_prompt = out.last_hidden_state[:, -1][inverse]  # predicts completion token 0
    return torch.cat([last_prompt.unsqueeze(1), out_c.last_hidden_state[:, :-1]], dim=1)


def _chunk_logprobs(hidden, weight, bias, targets, temperature: float, with_entropy: bool,
                    keep: SamplingFilter = SamplingFilter()):
    logits = upcast(F.linear(hidden, weight, bias)) / temperature  # [B, c, V], fp32 (fp64 model: fp64)
    # the sampler's keep set (rollout.top_k / top_p), renormalised over: -inf outside it
    logits = truncate_logits(logits, keep, targets)
    logz = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    probs = torch.softmax(logits, dim=-1)  # exactly 0 outside the keep set
    finite = logits.masked_fill(torch.isinf(logits), 0.0) if keep.active else logits  # 0 * -inf would be nan
    entropy = logz - (probs * finite).sum(-1)
    return logp, entropy


def token_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                   temperature: float = 1.0, chunk: int = 64, with_entropy: bool = False,
                   share_prefix: bool = False, keep: SamplingFilter = SamplingFilter()):
    """Log pi(token_t | prefix) of each completion token, and optionally the entropy.

    Args:
        model: a ``*ForCausalLM`` with ``get_output_embeddings()``.
        prompt_ids, prompt_mask: ``[B, Tp]`` left-padded.
        completion_ids, completion_mask: ``[B, Tc]`` right-padded.
        temperature: sampling temperature; logits are divided by it (0 is treated as 1).
        chunk: tokens per LM-head chunk (peak extra memory ~ B x chunk x V x 4 bytes).
        with_entropy: also return the per-token entropy of pi (nats).
        share_prefix: compute each distinct prompt once (:func:`shared_prefix_hidden`).
        keep: the sampler's truncation (``rollout.top_k`` / ``rollout.top_p``): the log-probs and
            the entropy are those of the distribution renormalised over its keep set, recomputed
            from these logits after temperature (:mod:`harness.truncation`), with the completion
            token always kept; inactive (the default): the full softmax.
    Returns:
        ``(logprobs [B, Tc], entropy [B, Tc])`` float32 (float64 for a float64 model); entropy is
        zeros unless requested.
        Values at masked positions are meaningless: always multiply by the mask.
    """
    temperature = temperature if temperature and temperature > 0 else 1.0
    hidden = completion_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                               share_prefix=share_prefix)
    head = model.get_output_embeddings()
    weight, bias = head.weight, getattr(head, "bias", None)
    logps, ents = [], []
    needs_grad = torch.is_grad_enabled() and hidden.requires_grad
    for s in range(0, hidden.shape[1], chunk):
        args = (hidden[:, s : s + chunk], weight, bias, completion_ids[:, s : s + chunk], temperature, with_entropy,
                keep)
        if needs_grad:
            lp, en = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, en = _chunk_logprobs(*args)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps, dim=1), torch.cat(ents, dim=1)
