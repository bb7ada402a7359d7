"""One optimisation pass over a rollout batch: micro-batches, per-token loss, aggregation.

Per-token loss (DeepSeekMath eq. 3, written as a loss to minimise; :func:`token_objective`)::

    loss_t = -min(ratio_t * A_t, clip(ratio_t, 1 - eps, 1 + eps_high) * A_t)
             + beta * KL_t            (kl.placement == "loss")
             - entropy_coef * H_t

aggregated with ``loss_agg`` over the *whole* batch's token/sequence counts (:func:`aggregate`),
so gradient accumulation over micro-batches gives the same gradient as one big batch. Every
setting is read from the run's :class:`harness.algo.Algorithm`, built once from the config at
startup: there is no second copy of the loss settings, and no config is read here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.algo import Algorithm, masked_mean
from harness.algo.aggregation import apply_aggregation
from harness.train.distributed import idle_backward, idle_passes, is_sharded, logprob_forward, world
from harness.model.kv import prompt_groups
from harness.model.logprobs import token_logprobs
from harness import progress
from harness.model.precision import autocast, upcast
from harness.model.truncation import SamplingFilter


@dataclass
class TrainBatch:
    """Everything the update needs, rows aligned; token tensors ``[B, Tc]``."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor  # completion mask, minus truncated rows when overlong.mask_truncated
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None = None  # None: on-policy (mu == 1), use detached current
    ref_logprobs: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    sampler_logprobs: torch.Tensor | None = None  # the sampler's log-probs (rollout_correction)
    # the tokens present (attended to) when they differ from loss_mask's: tool observations sit
    # between model tokens, attended but not trained on; None: loss_mask is also the attention mask
    attention_mask: torch.Tensor | None = None

    @property
    def present_mask(self) -> torch.Tensor:
        """``[B, Tc]`` the completion tokens the forward attends to."""
        return self.loss_mask if self.attention_mask is None else self.attention_mask

    def to(self, device) -> "TrainBatch":
        """The same batch on ``device`` (a no-op where it already is)."""
        return TrainBatch(*[None if v is None else v.to(device) for v in self.__dict__.values()])

    def rows(self, idx) -> "TrainBatch":
        """The rows ``idx`` (a slice or an index tensor)."""
        return TrainBatch(*[None if v is None else v[idx] for v in self.__dict__.values()])

    def trimmed(self) -> "TrainBatch":
        """Drop padding columns no row of this (micro-)batch needs: leading all-pad prompt columns
        and trailing completion columns after the longest completion. Exact: left pads are masked
        and right pads come after every real token of a causal model."""
        p0, tc = _trim_bounds(self.prompt_mask, self.present_mask)
        out = {}
        for k, v in self.__dict__.items():
            if v is None:
                out[k] = None
            elif k.startswith("prompt"):
                out[k] = v[:, p0:]
            elif v.dim() == 2 and v.shape[1] == self.loss_mask.shape[1]:
                out[k] = v[:, :tc]
            else:
                out[k] = v
        return TrainBatch(**out)


def _trim_bounds(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> tuple[int, int]:
    """(first prompt column any row uses, completion columns up to the longest completion)."""
    used = prompt_mask.any(dim=0).nonzero()
    p0 = int(used[0]) if len(used) else prompt_mask.shape[1] - 1
    p0 = min(p0, prompt_mask.shape[1] - 1)  # keep >= 1 prompt column (it predicts token 0)
    tc = max(int(completion_mask.sum(dim=1).max()), 1)
    return p0, tc


def length_order(prompt_mask: torch.Tensor, completion_mask: torch.Tensor,
                 groups: torch.Tensor | None = None) -> torch.Tensor:
    """Row order that groups similar lengths into the same micro-batch (less padding).

    Args:
        prompt_mask: ``[B, Tp]``; completion_mask: ``[B, Tc]``.
        groups: ``[B]`` prompt id of each row (:func:`harness.model.logprobs.prompt_groups`); when
            given, rows of the same prompt are kept next to each other (longest prompts first,
            then by prompt, then longest completions first) so that a micro-batch computes each
            prompt once under ``share_prefix``.
    Returns:
        ``[B]`` row indices. The loss normalisers are the whole batch's, so the order changes
        nothing but float summation order.
    """
    plen, clen = prompt_mask.sum(1), completion_mask.sum(1)
    if groups is None:
        return torch.argsort(plen * (completion_mask.shape[1] + 1) + clen, descending=True, stable=True)
    order = torch.argsort(clen, descending=True, stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    return order[torch.argsort(plen[order], descending=True, stable=True)]


def _groups(prompt_ids, prompt_mask, share_prefix: bool):
    return prompt_groups(prompt_ids, prompt_mask)[1] if share_prefix else None


def micro_batches(batch: TrainBatch, size: int, share_prefix: bool = False):
    """``(row indices, micro-batch)`` pairs: length-sorted, padding-trimmed micro-batches of ``size``
    rows (rows of one prompt kept together when ``share_prefix``)."""
    order = length_order(batch.prompt_mask, batch.present_mask, _groups(batch.prompt_ids, batch.prompt_mask, share_prefix))
    for start in range(0, len(order), size):
        idx = order[start : start + size]
        yield idx, batch.rows(idx).trimmed()


def padding_waste(prompt_mask: torch.Tensor, completion_mask: torch.Tensor, size: int,
                  prompt_ids: torch.Tensor | None = None) -> float:
    """Fraction of forward slots that are padding when processed by :func:`micro_batches`.

    Args:
        prompt_mask: ``[B, Tp]``; completion_mask: ``[B, Tc]``; size: rows per micro-batch.
        prompt_ids: ``[B, Tp]``; when given, the micro-batches are those of ``share_prefix``:
            each distinct prompt of a micro-batch is one forward row and counts once.
    Returns:
        ``1 - real tokens / padded slots`` over all micro-batches (0 = no padding).
    """
    share = prompt_ids is not None
    order = length_order(prompt_mask, completion_mask, _groups(prompt_ids, prompt_mask, share))
    slots = real = 0
    for start in range(0, len(order), size):
        idx = order[start : start + size]
        p0, tc = _trim_bounds(prompt_mask[idx], completion_mask[idx])
        prompt_rows = prompt_groups(prompt_ids[idx], prompt_mask[idx])[0] if share else \
            torch.arange(len(idx), device=prompt_mask.device)
        slots += len(prompt_rows) * (prompt_mask.shape[1] - p0) + len(idx) * tc
        real += int(prompt_mask[idx][prompt_rows].sum() + completion_mask[idx].sum())
    return 1.0 - real / max(slots, 1)


def high_entropy_mask(entropy: torch.Tensor, mask: torch.Tensor, quantile: float) -> torch.Tensor:
    """``[B, T]`` bool: the valid tokens whose entropy is in the top ``quantile`` fraction.

    Formula (Wang et al. 2025, "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive
    Effective RL for LLM Reasoning"; TRL ``top_entropy_quantile``, ``get_high_entropy_mask``):
    keep ``H >= quantile_{1-q}(H over the valid tokens)``. Computed over the (micro-)batch it is
    given, as TRL does per local batch.
    """
    valid = mask > 0
    if quantile >= 1.0 or not bool(valid.any()):
        return valid
    threshold = torch.quantile(upcast(entropy.detach()[valid]), 1.0 - quantile)
    return valid & (entropy.detach() >= threshold)


def token_objective(logp, old, ref, advantages, mask, entropy, algo: Algorithm, beta=None, weights=None,
                    entropy_coef=None):
    """The per-token loss of one (micro-)batch under the run's algorithm.

    Args:
        logp: ``[B, T]`` current log-probs (requires grad); ``old``: ``[B, T]`` behaviour
            log-probs (``logp.detach()`` on-policy); ``ref``: ``[B, T]`` reference log-probs or
            None; ``advantages``: ``[B, T]``; ``mask``: ``[B, T]`` float loss mask;
            ``entropy``: ``[B, T]`` per-token entropy (nats); ``algo``: the run's
            :class:`harness.algo.Algorithm`.
        beta: the KL coefficient of this step (the KL controller's; ``algo.kl.beta`` when None).
        entropy_coef: the entropy bonus's coefficient of this step (the entropy controller's;
            ``algo.entropy_coef`` when None).
        weights: optional detached ``[B, T]`` per-token weights of the policy loss (the rollout
            correction's importance weights, :mod:`harness.algo.rollout_correction`).
    Returns:
        ``(per_token_loss [B, T], stats)``: the registered policy loss ``policy_loss=<name>``
        (:mod:`harness.algo.policy_losses`, with its params), kept only on the top
        ``top_entropy_quantile`` of tokens by entropy (:func:`high_entropy_mask`),
        ``+ beta * KL`` (``kl.form``, ``kl.clamp``, times ``pi_theta / pi_old`` with
        ``kl.importance_correct``; only when ``kl.placement=loss``)
        ``- entropy_coef * H``; stats as the policy loss's plus ``kl`` and
        ``tokens_selected_frac``.
    """
    beta = algo.kl.beta if beta is None else beta
    per_token, stats = algo.policy_loss(logp, old, advantages, mask, weights=weights)
    keep = high_entropy_mask(entropy, mask, algo.top_entropy_quantile)
    per_token = per_token * keep
    stats["tokens_selected_frac"] = masked_mean(keep.to(per_token.dtype), mask)
    if ref is not None:
        kl = algo.kl.penalty(logp, ref, old_logprobs=old)
        if algo.kl.placement == "loss":
            per_token = per_token + beta * kl
        stats["kl"] = masked_mean(kl.detach(), mask)
    entropy_coef = algo.entropy_coef if entropy_coef is None else entropy_coef
    if entropy_coef:
        per_token = per_token - entropy_coef * entropy
    return per_token, stats


def aggregate(per_token, mask, algo: Algorithm, norm: dict):
    """``loss_agg`` of ``algo`` applied with the whole batch's normalisers ``norm``
    (:func:`global_normalizers`) and the generation cap ``algo.max_len``: a 0-dim tensor."""
    return apply_aggregation(algo.aggregation.spec, algo.aggregation.params, per_token, mask,
                             max_len=algo.max_len, **norm)


def global_normalizers(mask: torch.Tensor) -> dict:
    """The aggregation normalisers of the *global* batch: valid tokens, sequences with >= 1 valid
    token and rows of ``mask`` ``[b, T]`` summed over all ranks (:mod:`harness.train.distributed`), each
    at least 1. On one process these are :func:`harness.algo.aggregation_normalizers`'s counts.
    """
    m = mask.to(torch.bool)
    local = {"num_tokens": float(m.sum()), "num_seqs": float((m.sum(-1) > 0).sum()), "num_rows": float(m.shape[0])}
    return {k: max(int(round(v)), 1) for k, v in world().sum_dict(local).items()}


def policy_pass(policy, batch: TrainBatch, algo: Algorithm, micro_batch_size: int, beta=None, logprobs_out=None,
                entropy_coef=None) -> dict:
    """Accumulate gradients of the policy loss over micro-batches (no optimizer step).

    Data-parallel (``torchrun``): ``batch`` is this rank's rows; the normalisers are the global
    batch's (:func:`global_normalizers`), the gradients are summed over ranks at the end and the
    returned statistics are those of the global batch, so every rank ends with the gradient and
    statistics a single process computes on the whole batch.

    Args:
        algo: the run's :class:`harness.algo.Algorithm`: the loss is :func:`token_objective` +
            :func:`aggregate`, the rollout correction weighs it; ``algo.forward`` (temperature,
            chunk, prefix sharing, precision) sets the log-prob forward.
        beta, entropy_coef: this step's KL and entropy coefficients (their controllers'; the
            algorithm's when None).
        logprobs_out: optional ``[B, T]`` tensor filled with the pass's log-probs (detached, 0 past
            each row's trimmed length), e.g. for :class:`harness.train.trainer.StepRecord`.
    Returns:
        token-weighted means of the loss statistics over the batch (python floats); ``loss`` is
        the full-batch loss; ``entropy`` the mean per-token entropy (nats) over the loss tokens of
        ``policy``'s distribution with logits divided by ``rollout.temperature`` (the sampling
        distribution on the first pass, renormalised over the sampler's keep set under
        ``rollout.top_k`` / ``rollout.top_p``);
        ``clip_frac_low`` / ``clip_frac_high`` the policy loss's sided clip fractions (TRL's
        ``clip_ratio/low_mean`` / ``high_mean``, :mod:`harness.algo.policy_losses`).
    """
    norm = global_normalizers(batch.loss_mask)
    total_tokens = max(norm["num_tokens"], 1.0)
    fwd, correction = algo.forward, algo.rollout_correction
    share = fwd.share_prefix
    sums: dict[str, float] = {}
    forward = logprob_forward(policy)  # the FSDP2 root when sharded (harness.train.distributed.shard)
    mbs = list(micro_batches(batch, micro_batch_size, share))
    idle = idle_passes(policy, len(mbs))  # sharded: passes to add to match the busiest rank's collectives
    dev = next(policy.parameters()).device
    bar = progress.bar(len(mbs), "micro-batch")
    for idx, mb in mbs:
        mb = mb.to(dev)  # the batch stays on CPU; each micro-batch visits the model's device
        mask = mb.loss_mask.float()
        with autocast(fwd.precision, dev.type):  # bf16 matmuls; log-probs and everything after in fp32 (fp64)
            logp, entropy = forward(
                mb.prompt_ids, mb.prompt_mask, mb.completion_ids, mb.present_mask,
                temperature=fwd.temperature, chunk=fwd.chunk, with_entropy=True, share_prefix=share, keep=fwd.keep,
            )
        old = mb.old_logprobs if mb.old_logprobs is not None else logp.detach()
        if logprobs_out is not None:
            # sync: StepRecord.logprobs stays with the CPU batch; the first of the mu passes only
            logprobs_out[idx, : logp.shape[1]] = logp.detach().to(logprobs_out.device, logprobs_out.dtype)
        weights = None
        if correction.name != "none":
            if mb.sampler_logprobs is None:
                raise ValueError(f"rollout_correction={correction.name}: the rollout backend reported no sampler "
                                 "log-probs (greedy sampling?); use rollout_correction=none")
            # the behaviour policy as the trainer computes it vs the sampler: fixed for all mu passes;
            # a variant that declares it needs them also gets the advantages and this pass's log-ratio
            inputs = {"advantages": mb.advantages, "current_log_ratio": (logp.detach() - mb.sampler_logprobs) * mask}
            weights = correction((old - mb.sampler_logprobs) * mask, mask,
                                 **{k: v for k, v in inputs.items() if k in correction.spec.needs})
        # the objective under staleness (offpolicy=): the behaviour-to-proximal weight, or the above
        weights, off_stats = algo.offpolicy(old, mb.sampler_logprobs, mask, weights)
        per_token, stats = token_objective(logp, old, mb.ref_logprobs, mb.advantages, mask, entropy, algo, beta, weights,
                                          entropy_coef)
        if weights is not None and correction.name != "none":
            stats["rollout_is_weight_mean"] = masked_mean(weights, mask)
        stats.update(off_stats)
        loss = aggregate(per_token, mask, algo, norm)
        loss.backward()
        stats["entropy"] = masked_mean(entropy.detach(), mask)
        stats["loss"] = loss.detach() * 1.0  # summed over micro-batches = full-batch loss
        # summed on the device in float64 (the same sums python floats gave): no host sync per micro-batch
        w = mask.sum(dtype=torch.float64) / total_tokens
        for k, v in stats.items():
            v = torch.as_tensor(v, dtype=torch.float64, device=dev).detach()
            sums[k] = sums.get(k, 0.0) + (v if k == "loss" else v * w)
        bar.update(1)
    bar.close()
    sums = dict(zip(sums, torch.stack(list(sums.values())).tolist())) if sums else {}  # one sync per pass
    for _ in range(idle):
        with autocast(fwd.precision, dev.type):
            idle_backward(policy, share)
    if is_sharded(policy):  # summed over ranks: zero-loss passes spent waiting for the busiest rank
        sums["idle_passes"] = float(idle)
    world().all_reduce_grads(policy.parameters())
    return _global_stats(sums)


def _global_stats(sums: dict) -> dict:
    """Sum token-weighted statistics over ranks; a rank with no rows contributes zeros. The keys
    are the policy loss's, the same on every rank except on one that had no micro-batch."""
    return world().sum_dict(sums)


def batched_forward(fn, prompt_ids, prompt_mask, completion_ids, completion_mask, micro_batch_size,
                     share_prefix=False, device=None):
    """Run ``fn(prompt_ids, prompt_mask, completion_ids, completion_mask) -> [b, tc]`` over
    length-sorted, trimmed micro-batches; results in the original row order, zero-padded back to
    ``[B, Tc]`` float32 (log-probs of the old/reference policy, critic values; float64 when ``fn``
    returns float64: a float64 model's are not rounded to fp32) on the inputs' device.
    ``device``: where ``fn``'s model is (each micro-batch is moved there and back)."""
    out = torch.zeros(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
    move = (lambda t: t.to(device)) if device is not None else (lambda t: t)
    order = length_order(prompt_mask, completion_mask, _groups(prompt_ids, prompt_mask, share_prefix))
    with progress.bar(-(-len(order) // micro_batch_size), "micro-batch") as bar:
        for start in range(0, len(order), micro_batch_size):
            idx = order[start : start + micro_batch_size]
            p0, tc = _trim_bounds(prompt_mask[idx], completion_mask[idx])
            part = upcast(fn(move(prompt_ids[idx, p0:]), move(prompt_mask[idx, p0:]),
                             move(completion_ids[idx, :tc]), move(completion_mask[idx, :tc])))
            out = out.to(part.dtype)  # float64 from the first float64 part on (the zeros so far are exact)
            out[idx, :tc] = part.to(out.device)  # sync: old/ref log-probs and values join the CPU batch
            bar.update(1)
    return out


@torch.no_grad()
def batched_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                     temperature: float, chunk: int, micro_batch_size: int, share_prefix: bool = False,
                     precision: str = "fp32", keep: SamplingFilter = SamplingFilter()) -> torch.Tensor:
    """``[B, Tc]`` log-probabilities under ``model`` without gradients (old / reference policy).

    Args as :func:`harness.model.logprobs.token_logprobs`, run over micro-batches of
    ``micro_batch_size`` rows; ``precision`` as ``train.precision`` (:mod:`harness.model.precision`), so
    the old/reference log-probs are computed as the training forward computes the current ones.
    """

    dev = next(model.parameters()).device

    def fn(*args):
        with autocast(precision, dev.type):
            return token_logprobs(model, *args, temperature=temperature, chunk=chunk, share_prefix=share_prefix,
                                  keep=keep)[0]

    return batched_forward(fn, prompt_ids, prompt_mask, completion_ids, completion_mask, micro_batch_size,
                            share_prefix, device=dev)
