"""A lean batched decode over the policy's own KV cache (``rollout=lean``).

The same contract as ``rollout=hf`` (the policy module itself, weights shared, the same
:class:`harness.rollout.RolloutBatch`, greedy or seeded sampling with the sampler's log-probs),
decoded by a loop of its own around the model's forward instead of transformers ``generate``:

* **one shared prefix**: the longest token prefix common to every prompt of a call is prefilled
  once (the arith prompts' chat template, system prompt and 2-shot examples: 201 of ~232 tokens),
  then each distinct prompt's remaining tokens once, and the cache is copied to the rows that
  repeat a prompt (a GRPO group);
* **a preallocated cache** (:class:`BufferLayer`): a decode step writes one column in place, where
  transformers' ``DynamicCache`` concatenates, i.e. copies the whole cache, at every step;
* **finished rows leave the batch**: a row that emitted EOS stops costing compute; the batch is
  compacted once the finished rows are ``compact`` of it (a compaction copies the live rows' cache);
* **one forward per token**, and the pick: ``argmax`` (greedy), the per-row seeded exponential race
  of :class:`harness.rollout.hf._SeededSampler` (the same draws: row ``r``'s generator seeded by
  :func:`harness.rollout.hf.row_seed`, one ``[V]`` draw per step), or ``torch.multinomial``
  (unseeded); the sampler's log-prob is ``log_softmax(logits / T)`` over the top-k / top-p keep set
  (:func:`harness.model.truncation.keep_set`), as the ``hf`` backend records it.

``dtype`` / ``eval_dtype``: ``auto`` decodes on the policy module itself, in its dtype (fp32 for the
CPU presets), as ``hf`` does; ``bfloat16`` decodes on a bf16 copy of its weights (buffers such as the
rotary frequencies stay as they are), refreshed after each weight sync, as ``rollout=vllm``'s engine
dtype does: on a CPU with native bf16 its matmuls run ~4x faster. ``dtype`` applies to the trainer's
rollouts, ``eval_dtype`` to the evals (:attr:`SamplingParams.purpose`); the eval is the measurement,
so a study that sets ``eval_dtype`` says so in its design.

The maths is ``generate``'s; the float rounding is not bit for bit: the prefix's keys and values are
computed once instead of once per row, and the matmuls see other batch shapes. On the embedded
model the greedy completions of the arith eval equal ``generate``'s token for token
(``tests/test_lean_rollout.py`` states what it allows). Episode turns with tools
(:meth:`sample_ids`) are ``generate``'s, inherited from the ``hf`` backend. The attention runs
through the model's own ``sdpa`` or ``eager`` implementation with a 4D mask built here.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from harness import progress
from harness.model.kv import cache_kwarg
from harness.model.precision import upcast
from harness.rollout.base import BACKENDS, RolloutBatch, RolloutConfig, SamplingParams
from harness.rollout.hf import HFRollout, completion_mask_from_ids, race_noise, row_seed
from harness.model.truncation import keep_set

DECODE_ATTENTION = "harness_lean_decode"  # the low-precision copy's attention (decode_attention)
# the attention implementations whose 4D mask form is known
MASK_FORMS = {"sdpa": "bool", "eager": "additive", DECODE_ATTENTION: "bool"}
DTYPES = {"auto": None, "bfloat16": torch.bfloat16}  # what dtype / eval_dtype decode with (None: the policy itself)


@dataclass
class LeanRolloutConfig(RolloutConfig):
    """``rollout=lean``: :class:`LeanRollout`. ``share_prefix``: prefill the prompts' common prefix
    once and each distinct prompt once (false: every row prefilled on its own)."""

    CHOICES: ClassVar[dict] = {"dtype": tuple(DTYPES), "eval_dtype": tuple(DTYPES)}  # what validate reads

    backend: str = "lean"
    # compact the batch once its finished rows are more than this fraction of it (0: at every finished row; 1: never)
    compact: float = 0.25
    dtype: str = "auto"  # the trainer's rollouts: auto = the policy module itself; bfloat16 = a bf16 copy of it
    eval_dtype: str = "auto"  # the evals (the measurement): the same choices


class BufferLayer(DynamicLayer):
    """One attention layer's cache in a preallocated ``[rows, kv_heads, capacity, head_dim]`` buffer.

    :meth:`update` writes the new keys and values in place after the ones held and returns the
    whole buffer; the caller's 4D mask hides the positions not yet written (zeros, so that a masked
    position's weight 0 times its value is 0). Row selection (:meth:`batch_select_indices`) and
    repetition are ``DynamicLayer``'s, on the buffer.
    """

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.length = capacity, 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        b, h, _, d = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(b, h, self.capacity, d)
        self.values = value_states.new_zeros(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        if self.length + q > self.capacity:
            raise RuntimeError(f"BufferLayer: {self.length} + {q} tokens exceed the capacity {self.capacity}")
        self.keys[:, :, self.length : self.length + q] = key_states
        self.values[:, :, self.length : self.length + q] = value_states
        self.length += q
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.capacity, 0

    def get_max_length(self) -> int:
        return self.capacity


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs):
    """Attention of one new token per row as two batched matmuls, ``softmax(q k^T * scaling)`` in at
    least fp32 (:func:`harness.model.precision.upcast`); longer blocks (prefill) go to transformers' ``sdpa``.
    For one query, torch's CPU flash kernel ran 2.7x slower in bf16 than these matmuls (32-50 rows x
    281 keys, one thread, AMD EPYC Zen 5).

    Args:
        query: ``[B, H, 1, D]``; key, value: ``[B, Hkv, T, D]`` (grouped-query heads: ``H = g * Hkv``).
        attention_mask: ``[B, 1, 1, T]`` bool, True = attend (:func:`block_mask`).
    Returns:
        (``[B, 1, H, D]``, None), as transformers' attention functions return.
    """
    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, h, _, d = query.shape
    kv, scaling = key.shape[1], d**-0.5 if scaling is None else scaling
    scores = upcast(torch.matmul(query.view(b, kv, h // kv, d), key.transpose(-1, -2))) * scaling  # [B, Hkv, g, T]
    probs = scores.masked_fill(~attention_mask, float("-inf")).softmax(-1).to(value.dtype)
    return torch.matmul(probs, value).reshape(b, 1, h, d), None


AttentionInterface.register(DECODE_ATTENTION, decode_attention)


def buffer_cache(model, capacity: int) -> DynamicCache:
    """A cache for ``model`` whose every layer is a :class:`BufferLayer` of ``capacity`` tokens.

    Raises:
        ValueError: a layer whose cache is not a plain full-attention one (sliding window, linear
            attention, ...), or an attention implementation other than ``sdpa`` / ``eager``.
    """
    impl = model.config._attn_implementation
    if impl not in MASK_FORMS:
        raise ValueError(f"rollout=lean: attention implementation {impl!r} is not supported (expected one of "
                         f"{sorted(MASK_FORMS)}); use rollout=hf")
    cache = DynamicCache(config=model.config)
    kinds = {type(layer).__name__ for layer in cache.layers}
    if kinds != {"DynamicLayer"}:
        raise ValueError(f"rollout=lean: the model's cache layers are {sorted(kinds)}; only plain full-attention "
                         "layers (DynamicLayer) are supported; use rollout=hf")
    cache.layers = [BufferLayer(capacity) for _ in cache.layers]
    return cache


def block_mask(valid: torch.Tensor, start: int, q: int, form: str, dtype: torch.dtype) -> torch.Tensor:
    """The 4D attention mask ``[b, 1, q, capacity]`` of ``q`` new tokens written at buffer positions
    ``start .. start + q - 1``: query ``i`` sees the valid positions up to its own, and always itself
    (a padding query then attends to something; its output is never used and its key is not valid).

    Args:
        valid: ``[b, capacity]`` bool, True where a real token is (or is being) written.
        form: ``bool`` (True = attend, sdpa) or ``additive`` (0 / the dtype's minimum, eager).
    """
    j = torch.arange(valid.shape[1], device=valid.device)
    at = start + torch.arange(q, device=valid.device)
    m = (valid[:, None, None, :] & (j[None, :] <= at[:, None])) | (j[None, :] == at[:, None])
    if form == "bool":
        return m
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, torch.finfo(dtype).min)


def pick(logits: torch.Tensor, params: SamplingParams, gens: list | None):
    """The next token of each row and its sampler log-prob.

    Args:
        logits: ``[b, V]`` float32, the last position's logits.
        params: greedy when ``temperature == 0``; else ``temperature``, ``top_k``, ``top_p``.
        gens: one ``torch.Generator`` per row (the seeded race), or None (``torch.multinomial``).
    Returns:
        ``(tokens [b] long, log-probs [b] float32 or None under greedy decoding)``.
    """
    if params.temperature == 0:
        return logits.argmax(-1), None
    scaled = logits / params.temperature
    if params.top_k or params.top_p < 1.0:
        scaled = scaled.masked_fill(~keep_set(scaled, params.top_k, params.top_p), float("-inf"))
    logp = torch.log_softmax(scaled, dim=-1)
    if gens is None:
        tokens = torch.multinomial(logp.exp(), 1).squeeze(1)
    else:  # argmax(l / T - log E), E ~ Exp(1) per row: an exact draw from softmax(l / T) (Gumbel-max)
        tokens = (scaled - race_noise(gens, logits.shape[1], logits.device).log()).argmax(-1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


@BACKENDS.register("lean", params=LeanRolloutConfig)
class LeanRollout(HFRollout):
    """The lean decode (module docstring); ``batch_size``, ``progress`` and ``share_prefix`` as ``hf``'s,
    ``compact``, ``dtype`` and ``eval_dtype`` (:class:`LeanRolloutConfig`).

    Raises:
        ValueError: ``compact`` outside [0, 1]; ``dtype`` / ``eval_dtype`` not in :data:`DTYPES`; a model
            :func:`buffer_cache` does not support.
    """

    def __init__(self, model, tokenizer, params: LeanRolloutConfig):
        super().__init__(model, tokenizer, params)
        if not 0.0 <= params.compact <= 1.0:
            raise ValueError(f"rollout.compact={params.compact}: expected a fraction in [0, 1]")
        for key in ("dtype", "eval_dtype"):
            if getattr(params, key) not in DTYPES:
                raise ValueError(f"rollout.{key}={getattr(params, key)!r}: expected one of {list(DTYPES)}")
        self.compact, self.dtypes = params.compact, {"rollout": params.dtype, "eval": params.eval_dtype}
        self.copy, self.stale = None, True  # the low-precision copy of the policy, and whether it lags the policy
        buffer_cache(model, 1)  # refuses an unsupported model now, not at the first rollout

    def sync_weights(self, model) -> None:
        """Decode with ``model`` from now on; a low-precision copy is refreshed from it when next used."""
        self.model, self.stale = model, True

    def decoder(self, purpose: str):
        """The module that decodes for ``purpose`` (``rollout`` / ``eval``): the policy itself, or its
        copy in the dtype that purpose's key names, refreshed first when the policy changed since."""
        dtype = DTYPES[self.dtypes[purpose]]
        if dtype is None:
            return self.model
        if self.copy is None or self.copy.dtype != dtype:
            self.copy = copy.deepcopy(self.model).eval()
            for p in self.copy.parameters():  # parameters only: buffers (rotary frequencies) keep their dtype
                p.grad = None
                p.requires_grad_(False)
                p.data = p.data.to(dtype)
            self.copy.set_attn_implementation(DECODE_ATTENTION)
        elif self.stale:
            for dst, src in zip(self.copy.parameters(), self.model.parameters()):
                dst.copy_(src.detach())
        self.stale = False
        return self.copy

    def _generate(self, rows: list[str], group_size: int, params: SamplingParams, first_row: int = 0) -> RolloutBatch:
        enc = self.tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False)  # as hf's batch
        index: dict[str, int] = {}
        inverse = [index.setdefault(r, len(index)) for r in rows] if self.share_prefix else list(range(len(rows)))
        distinct = list(index) if self.share_prefix else rows
        ids = self.tokenizer(distinct, add_special_tokens=False)["input_ids"]
        first = params.row_offset + first_row
        gens = None
        if params.temperature != 0 and params.seed is not None:
            gens = [torch.Generator(device=self.model.device).manual_seed(row_seed(params.seed, r))
                    for r in range(first, first + len(rows))]
        # cpu: row indices, moved to the model's device inside _decode
        completion, logps = self._decode(self.decoder(params.purpose), ids, torch.tensor(inverse), params, gens)
        pad = self.tokenizer.pad_token_id
        if completion.shape[1] == 0:  # max_new_tokens=0
            completion = torch.full((len(rows), 1), pad, dtype=torch.long)  # cpu: a rollout batch lives on the CPU
            mask, truncated = torch.zeros_like(completion), torch.ones(len(rows), dtype=torch.bool)  # cpu: as above
        else:
            mask, truncated = completion_mask_from_ids(completion, self.eos_ids)
        texts = self.tokenizer.batch_decode(completion * mask + pad * (1 - mask), skip_special_tokens=True)
        sampler = None if logps is None else logps[:, : completion.shape[1]] * mask
        return RolloutBatch(enc["input_ids"], enc["attention_mask"], completion, mask, truncated, texts, group_size,
                            sampler)

    @staticmethod
    def _forward(model, cache, ids, valid, start, positions):
        """One forward of ``ids`` ``[b, q]`` written at buffer positions ``start ..``; the last position's
        logits ``[b, V]`` in float32 (as ``generate`` hands them to its samplers)."""
        mask = block_mask(valid, start, ids.shape[1], MASK_FORMS[model.config._attn_implementation],
                          next(model.parameters()).dtype)
        # the last position as an index tensor: its hidden states are gathered contiguous (a slice of a
        # longer block is not, and bf16's matmul then broadcasts the LM head's weight over the rows)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                    logits_to_keep=torch.tensor([ids.shape[1] - 1], device=ids.device),
                    **{cache_kwarg(type(model)): cache})
        return out.logits[:, -1].float()

    def _prefill(self, model, prompts: list[list[int]], inverse: torch.Tensor, new_tokens: int):
        """The prompts' cache: their common prefix once (``share_prefix``), then each distinct prompt's
        rest (left-padded), gathered to the rows ``inverse`` (row ``b`` continues ``prompts[inverse[b]]``).

        Returns:
            ``(cache, logits [B, V] of each row's next token, valid [B, capacity] bool, next position [B],
            next buffer column)``, room left in the cache for ``new_tokens`` tokens.
        """
        dev, pad, shortest = model.device, self.tokenizer.pad_token_id, min(len(p) for p in prompts)
        if shortest == 0:
            raise ValueError("rollout=lean: a prompt tokenized to no tokens; expected at least one")
        L = min(len(os.path.commonprefix(prompts)), shortest - 1) if self.share_prefix else 0
        S = max(len(p) for p in prompts) - L
        cache = buffer_cache(model, L + S + new_tokens)
        valid = torch.zeros(1 if L else len(prompts), L + S + new_tokens, dtype=torch.bool, device=dev)
        if L:  # the common prefix, once
            valid[:, :L] = True
            self._forward(model, cache, torch.tensor([prompts[0][:L]], device=dev), valid, 0,
                          torch.arange(L, device=dev)[None])
            cache.batch_repeat_interleave(len(prompts))
            valid = valid.expand(len(prompts), -1).clone()
        suffix = torch.tensor([[pad] * (L + S - len(p)) + p[L:] for p in prompts], device=dev)  # left-padded
        real = torch.tensor([[0] * (L + S - len(p)) + [1] * (len(p) - L) for p in prompts], device=dev)
        valid[:, L : L + S] = real.bool()
        positions = L + real.cumsum(1) - 1
        logits = self._forward(model, cache, suffix, valid, L, positions.clamp(min=0))
        inverse = inverse.to(dev)
        cache.batch_select_indices(inverse)  # each distinct prompt's cache to the rows that repeat it
        return cache, logits[inverse], valid[inverse], positions[:, -1][inverse] + 1, L + S

    def _decode(self, model, prompts: list[list[int]], inverse: torch.Tensor, params: SamplingParams, gens):
        """Decode with ``model`` the rows ``inverse`` (row ``b`` continues ``prompts[inverse[b]]``): one
        forward a token, the rows that emitted EOS dropped from the batch once they are more than
        ``compact`` of it.

        Returns:
            ``(completion [B, Tc] long, pad after EOS; log-probs [B, Tc] float32 or None)``, ``Tc`` the
            steps run (the longest row's length), on the CPU.
        """
        dev, B, max_new = model.device, len(inverse), params.max_new_tokens
        cache, logits, valid, nxt_pos, at = self._prefill(model, prompts, inverse, max_new)
        live = torch.arange(B, device=dev)  # the output row of each batch row
        active = torch.ones(B, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(self.eos_ids), device=dev)
        out = torch.full((B, max_new), self.tokenizer.pad_token_id, dtype=torch.long)  # cpu: gathered on the host
        logps = None if params.temperature == 0 else torch.zeros(B, max_new)  # cpu: as out
        steps = 0
        with progress.bar(max_new, "tok", desc=f"{progress.current_phase() or 'rollout'} ({B} seqs)",
                          disable=not self.progress) as bar:
            for t in range(max_new):
                tokens, lp = pick(logits, params, None if gens is None else [gens[i] for i in live.tolist()])
                rows = live[active].cpu()
                out[rows, t] = tokens[active].cpu()
                if lp is not None:
                    logps[rows, t] = lp[active].cpu()
                active &= ~torch.isin(tokens, eos)
                steps = t + 1
                bar.update(1)
                if steps == max_new or not bool(active.any()):
                    break
                if int((~active).sum()) > self.compact * len(active):  # drop the finished rows
                    keep = active.nonzero().squeeze(1)
                    cache.batch_select_indices(keep)
                    live, tokens, valid, nxt_pos = live[keep], tokens[keep], valid[keep], nxt_pos[keep]
                    active = active[keep]
                valid[:, at] = True
                logits = self._forward(model, cache, tokens[:, None], valid, at, nxt_pos[:, None])
                at, nxt_pos = at + 1, nxt_pos + 1
        return out[:, :steps], None if logps is None else logps[:, :steps]
