"""Per-token log-probabilities of completions under a causal LM, without full-batch logits.

Training forward passes rebuild exactly what sampling saw: the left-padded prompt followed
by the completion, the same attention mask and the same position ids (``cumsum(mask) - 1``,
as transformers ``generate`` computes them), and logits divided by the sampling temperature,
so that on-policy the ratio pi/pi_old is exactly 1.

Memory: the ``[B, T, V]`` logits tensor (49,152 x 4 bytes per token for SmolLM2) is never
built for the whole batch. The LM head runs over chunks of ``chunk`` tokens, each chunk one
fused autograd node (:class:`LinearLogSoftmaxGather`) that recomputes its logits in backward,
so each chunk's logits live only while that chunk is processed (forward and again in backward).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from harness.model.kv import cache_kwarg, prompt_cache, prompt_groups
from harness.model.precision import upcast
from harness.model.truncation import SamplingFilter, truncate_logits


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
        # run the same forwards, whose all-gathers are collectives; harness.train.distributed)
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


def _scaled_logits(hidden, weight, bias, temperature: float):
    """``[..., V]`` logits / temperature in at least float32 (:func:`harness.model.precision.upcast`)."""
    return upcast(F.linear(hidden, weight, bias)).div_(temperature)


class LinearLogSoftmaxGather(torch.autograd.Function):
    """LM head + log-softmax + sampled-token gather (+ entropy) as one autograd node.

    Forward, for one chunk of hidden states ``h [B, c, H]``, head ``W [V, H]`` (bias ``b [V]``
    or None), targets ``y [B, c]`` and temperature ``T``, with ``z = (h W^T + b) / T``:

    * ``logp = z_y - logsumexp(z)``, the log-probability of each target token;
    * ``entropy = -sum_v p_v log p_v`` with ``p = softmax(z)`` (nats), zeros unless asked for.

    Backward recomputes ``z`` (as activation checkpointing of the unfused chunk did) and writes
    the gradient of the logits in one pass, in closed form:

    * ``d logp / d z = onehot(y) - p``;
    * ``d entropy / d z = p * (-entropy - log p)``, i.e. ``p_v (E_p[log p] - log p_v)``;

    then ``dL/dh = (dL/dz / T) W``, ``dL/dW = (dL/dz / T)^T h``, ``dL/db = sum dL/dz / T``.
    The unfused autograd graph (logsumexp, gather, softmax) builds the same gradient from a
    zero-filled ``[B, c, V]`` tensor that the gather's backward scatters into, plus the
    logsumexp's and softmax's own elementwise passes, which a profile of the update measured at
    ~2 s of 12.5 s (results/benchmarks.md, with machine and date). Same maths, so the two agree to float rounding
    (``tests/test_logprobs.py`` checks values and all three gradients in float64 to 1e-12).

    Only the ``[B, c]`` log-normaliser is kept between forward and backward; the ``[B, c, V]``
    logits live only inside each pass, as under checkpointing.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, with_entropy: bool):
        z = _scaled_logits(hidden, weight, bias, temperature)  # [B, c, V]
        logz = torch.logsumexp(z, dim=-1)  # [B, c]
        logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logz
        if with_entropy:
            logp_all = z.sub_(logz.unsqueeze(-1))  # log p, in place of z
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            entropy = torch.zeros_like(logp)
        ctx.save_for_backward(hidden, weight, bias, targets, logz)
        ctx.temperature = temperature
        ctx.with_entropy = with_entropy
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, bias, targets, logz = ctx.saved_tensors
        logp_all = _scaled_logits(hidden, weight, bias, ctx.temperature).sub_(logz.unsqueeze(-1))
        probs = logp_all.exp()  # [B, c, V]
        if ctx.with_entropy and grad_entropy is not None:
            entropy = -(probs * logp_all).sum(-1, keepdim=True)
            # g_H * p * (-H - log p) - g_logp * p, reusing logp_all's storage
            grad = logp_all.neg_().sub_(entropy).mul_(grad_entropy.unsqueeze(-1))
            grad = grad.sub_(grad_logp.unsqueeze(-1)).mul_(probs)
        else:
            grad = probs.mul_(grad_logp.unsqueeze(-1).neg())
        grad.scatter_add_(-1, targets.unsqueeze(-1), grad_logp.unsqueeze(-1).to(grad.dtype))
        grad = grad.div_(ctx.temperature).to(weight.dtype)
        grad_hidden = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_hidden = grad @ weight
        if ctx.needs_input_grad[1]:
            grad_weight = grad.flatten(0, -2).T @ hidden.flatten(0, -2)
        if bias is not None and ctx.needs_input_grad[2]:
            grad_bias = grad.flatten(0, -2).sum(0)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _chunk_logprobs(hidden, weight, bias, targets, temperature: float, with_entropy: bool,
                    keep: SamplingFilter = SamplingFilter()):
    """The unfused reference of :class:`LinearLogSoftmaxGather` (plain autograd ops); the
    no-grad passes (old / reference log-probs), truncated sampling (``keep.active``) and the
    tests use it."""
    logits = _scaled_logits(hidden, weight, bias, temperature)  # [B, c, V], fp32 (fp64 model: fp64)
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
            from these logits after temperature (:mod:`harness.model.truncation`), with the completion
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
        if needs_grad and not keep.active:
            lp, en = LinearLogSoftmaxGather.apply(*args[:-1])
        elif needs_grad:  # truncated sampling: the plain ops (their -inf handling), recomputed in backward
            lp, en = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            lp, en = _chunk_logprobs(*args)
        logps.append(lp)
        ents.append(en)
    return torch.cat(logps, dim=1), torch.cat(ents, dim=1)
