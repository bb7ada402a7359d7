"""Rollout with transformers ``generate`` on the policy module itself (weights shared)."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

from harness import progress
from harness.model.kv import cache_kwarg, prompt_cache
from harness.model.precision import upcast
from harness.rollout.base import (BACKENDS, RolloutBatch, RolloutConfig, Sample, SamplingParams, concat_batches,
                                  end_of_turn)
from harness.model.truncation import SamplingFilter, keep_set


def completion_mask_from_ids(completion_ids: torch.Tensor, eos_ids: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask tokens after the first EOS.

    Args:
        completion_ids: ``[B, Tc]`` generated ids (pad after EOS).
        eos_ids: token ids that end a completion.
    Returns:
        (mask ``[B, Tc]`` long, 1 up to and including the first EOS; truncated ``[B]`` bool).
    """
    is_eos = torch.zeros_like(completion_ids, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= completion_ids == e
    # number of EOS tokens strictly before each position
    before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    mask = (before == 0).long()
    truncated = ~is_eos.any(dim=1)
    return mask, truncated


class _TokenProgress:
    """A no-op logits processor that advances a tqdm bar once per decode step."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids, scores):
        self.bar.update(1)
        return scores


class _LogprobRecorder:
    """A logits processor (first in the list, so it sees the raw logits) that records the
    sampler's log-probability of each sampled token: ``log_softmax(logits / T)`` at the token
    drawn, i.e. the distribution the token was sampled from, in the precision of the logits it is
    given (``generate`` hands float32 logits even to a float64 model).

    With a truncation (``top_k`` / ``top_p``, :mod:`harness.model.truncation`) it also applies it: the
    keep set is computed from ``logits / T`` (:func:`harness.model.truncation.keep_set`, the function
    the trainer's log-probs call), the logits it returns are ``-inf`` outside it (so the seeded
    race and transformers' sampler that follow draw only from it), and the recorded log-prob is
    renormalised over it.

    At decoding step t it reads the token chosen at step t-1 (the last column of ``input_ids``)
    from the previous step's log-softmax; :meth:`finish` reads the final token from the last one.
    """

    def __init__(self, temperature: float, keep: SamplingFilter = SamplingFilter()):
        self.temperature, self.keep = temperature, keep
        self.prev: torch.Tensor | None = None
        self.out: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.out.append(self.prev.gather(1, input_ids[:, -1:]).squeeze(1))
        logits = upcast(scores) / self.temperature
        if self.keep.active:
            kept = keep_set(logits, self.keep.top_k, self.keep.top_p)
            logits = logits.masked_fill(~kept, float("-inf"))
            scores = scores.masked_fill(~kept, float("-inf"))
        self.prev = torch.log_softmax(logits, dim=-1)
        return scores

    def finish(self, completion: torch.Tensor) -> torch.Tensor:
        """``[B, Tc]`` log-probs of ``completion`` (its last column read from the last step)."""
        if self.prev is not None and len(self.out) < completion.shape[1]:
            self.out.append(self.prev.gather(1, completion[:, len(self.out) : len(self.out) + 1]).squeeze(1))
        self.prev = None
        if not self.out:
            # cpu: as the other branch's .cpu(): a rollout batch lives on the CPU
            return torch.zeros(completion.shape, dtype=torch.float32)
        return torch.stack(self.out[: completion.shape[1]], dim=1).cpu()


def row_seed(seed: int, row: int) -> int:
    """The generator seed of row ``row`` of a call seeded with ``seed`` (63-bit, deterministic)."""
    return (int(seed) * 1_000_003 + int(row) * 7_919 + 1) % (2**63 - 1)


def race_noise(gens: list, vocab: int, device) -> torch.Tensor:
    """The seeded exponential race's noise of one decoding step: ``[len(gens), vocab]`` float32 draws of
    Exp(1), one ``[vocab]`` draw from each row's generator (:class:`_SeededSampler`, ``rollout=lean``'s pick)."""
    return torch.stack([torch.empty(vocab, device=device).exponential_(generator=g) for g in gens])


class _SeededSampler:
    """Sampling from ``softmax(logits / T)`` as a per-row seeded exponential race.

    ``argmax_i (l_i / T - log E_i)`` with ``E_i ~ Exp(1)`` i.i.d. is an exact draw from
    ``softmax(l / T)`` (the Gumbel-max trick: ``-log E`` is Gumbel(0, 1)). Row ``r``'s noise comes
    from its own ``torch.Generator`` seeded by :func:`row_seed`, one ``[V]`` draw per decoding
    step, so a row's tokens depend only on its prompt, the weights, the seed and its index. Used
    as a logits processor under greedy decoding (``do_sample=False``).
    """

    def __init__(self, seed: int, rows: range, temperature: float, device):
        self.temperature = temperature
        self.gens = [torch.Generator(device=device).manual_seed(row_seed(seed, r)) for r in rows]

    def __call__(self, input_ids, scores):
        return scores.float() / self.temperature - race_noise(self.gens, scores.shape[1], scores.device).log()


class _StopOnText(StoppingCriteria):
    """Stops a row once the text it generated in this call contains ``stop`` (checked on the
    decoded tail: the last ``tail`` tokens); rows stop independently."""

    def __init__(self, tokenizer, stop: str, start: int, tail: int = 16):
        self.tokenizer, self.stop, self.start, self.tail = tokenizer, stop, start, tail

    def __call__(self, input_ids, scores, **kwargs):
        new = input_ids[:, self.start :]
        tails = self.tokenizer.batch_decode(new[:, -self.tail :])
        return torch.tensor([self.stop in t for t in tails], dtype=torch.bool, device=input_ids.device)


@BACKENDS.register("hf", params=RolloutConfig)
class HFRollout:
    """``generate``-based backend: all prompts x G samples per call, in chunks of ``batch_size``.

    Args:
        model: the policy (``PreTrainedModel``); generation runs under ``no_grad``.
        tokenizer: left-padding tokenizer with a pad token.
        params: the ``rollout`` node; read here: ``batch_size`` (sequences per ``generate`` call;
            0 = everything in one call), ``progress`` (a tqdm bar over chunks) and ``share_prefix``
            (prefill each distinct prompt once and copy its KV cache to the rows that repeat it, as
            a GRPO group repeats its prompt G times, instead of prefilling every row; sampling is
            unchanged, only float rounding of the prompt's keys/values can differ). The sampling
            keys reach :meth:`generate` as :class:`SamplingParams`.
    """

    def __init__(self, model, tokenizer, params: RolloutConfig):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress, self.share_prefix = params.batch_size, params.progress, params.share_prefix
        eos = model.generation_config.eos_token_id if model.generation_config else None
        eos = eos if isinstance(eos, (list, tuple)) else [eos]
        self.eos_ids = {e for e in [*eos, tokenizer.eos_token_id] if e is not None}

    def sync_weights(self, model) -> None:  # the module is shared: nothing to copy
        self.model = model

    @torch.no_grad()
    def generate(self, prompts: list[str], num_samples: int, params: SamplingParams) -> RolloutBatch:
        """Sample ``num_samples`` completions for each prompt (rows group-major).

        Raises:
            ValueError: empty ``prompts`` or ``num_samples`` < 1.
        """
        if not prompts or num_samples < 1:
            raise ValueError(f"need prompts and num_samples >= 1, got {len(prompts)} prompts, {num_samples}")
        rows = [p for p in prompts for _ in range(num_samples)]
        step = self.batch_size or len(rows)
        chunks = range(0, len(rows), step)
        was_training = self.model.training
        self.model.eval()
        try:
            out = [self._generate(rows[i : i + step], num_samples, params, first_row=i) for i in chunks]
        finally:
            self.model.train(was_training)
        return concat_batches(out, self.tokenizer.pad_token_id)

    def _shared_prefill(self, rows: list[str], enc: dict):
        """KV cache of ``prompt[:, :-1]`` for every row, computed once per distinct prompt.

        ``generate`` then only runs the last prompt token of each row before sampling, as when
        a cache is reused across calls (transformers' "re-use the prompt cache" pattern).

        Returns:
            a transformers ``Cache`` gathered to ``len(rows)`` rows, or None when no prompt
            repeats, the prompt is one token long, or the model returns no batch-selectable cache.
        """
        index: dict[str, int] = {}
        inverse = [index.setdefault(r, len(index)) for r in rows]
        ids, mask = enc["input_ids"], enc["attention_mask"]
        if len(index) == len(rows) or ids.shape[1] < 2:
            return None
        first = [inverse.index(u) for u in range(len(index))]
        return prompt_cache(self.model, ids[first, :-1], mask[first, :-1], torch.tensor(inverse, device=ids.device),
                            logits_to_keep=1)[1]

    def _generate(self, rows: list[str], group_size: int, params: SamplingParams, first_row: int = 0) -> RolloutBatch:
        enc = self.tokenizer(rows, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.model.device) for k, v in enc.items()}
        greedy = params.temperature == 0
        # the recorder also applies top_k / top_p (the trainer's keep set), so both samplers below see it
        recorder = None if greedy else _LogprobRecorder(params.temperature, SamplingFilter(params.top_k, params.top_p))
        processors = [recorder] if recorder is not None else []
        if greedy:
            kwargs = dict(do_sample=False)
        elif params.seed is not None:
            kwargs = dict(do_sample=False)
            first = params.row_offset + first_row
            processors.append(_SeededSampler(params.seed, range(first, first + len(rows)), params.temperature,
                                             self.model.device))
        else:
            kwargs = dict(do_sample=True, temperature=params.temperature, top_p=1.0, top_k=0)  # truncated above

        cache = self._shared_prefill(rows, enc) if self.share_prefix else None
        if cache is not None:
            kwargs[cache_kwarg(type(self.model))] = cache
        with progress.bar(params.max_new_tokens, "tok", desc=f"{progress.current_phase() or 'rollout'} "
                          f"({len(rows)} seqs)", disable=not self.progress) as bar:
            seq = self.model.generate(
                **enc, max_new_tokens=params.max_new_tokens, pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=sorted(self.eos_ids),
                logits_processor=LogitsProcessorList([*processors, _TokenProgress(bar)]),
                # transformers turns this on for an FSDP-managed model (a collective per decoding
                # step); the trainer generates on gathered weights, each rank at its own pace
                synced_gpus=False,
                **kwargs,
            )
        tp = enc["input_ids"].shape[1]
        completion = seq[:, tp:]
        if completion.shape[1] == 0:  # max_new_tokens=0 or immediate stop
            completion = torch.full((len(rows), 1), self.tokenizer.pad_token_id, device=seq.device)
            mask = torch.zeros_like(completion)
            truncated = torch.ones(len(rows), dtype=torch.bool, device=seq.device)
        else:
            mask, truncated = completion_mask_from_ids(completion, self.eos_ids)
        texts = self.tokenizer.batch_decode(completion * mask + self.tokenizer.pad_token_id * (1 - mask),
                                            skip_special_tokens=True)
        sampler = None if recorder is None else recorder.finish(completion) * mask.cpu()
        return RolloutBatch(enc["input_ids"].cpu(), enc["attention_mask"].cpu(), completion.cpu(),
                            mask.cpu(), truncated.cpu(), texts, group_size, sampler)

    @torch.no_grad()
    def sample_ids(self, rows: list[list[int]], params: SamplingParams, max_new: list[int], stop: str | None,
                   row_index: list[int]) -> list[Sample]:
        """One episode turn per row (:meth:`harness.rollout.base.RolloutBackend.sample_ids`): the
        rows left-padded into ``generate`` calls of ``batch_size``, each run for the largest
        ``max_new`` of its rows and cut per row by :func:`harness.rollout.base.end_of_turn`
        (a row's tokens do not depend on the other rows under seeded or greedy sampling, so
        cutting a row at its own budget is the same as generating it alone)."""
        step = self.batch_size or len(rows)
        was_training = self.model.training
        self.model.eval()
        try:
            return [s for i in range(0, len(rows), step)
                    for s in self._sample_ids(rows[i : i + step], params, max_new[i : i + step], stop,
                                              row_index[i : i + step])]
        finally:
            self.model.train(was_training)

    def _sample_ids(self, rows, params, max_new, stop, row_index) -> list[Sample]:
        pad, dev = self.tokenizer.pad_token_id, self.model.device
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], dtype=torch.long, device=dev)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=torch.long, device=dev)
        greedy = params.temperature == 0
        recorder = None if greedy else _LogprobRecorder(params.temperature)
        processors = [recorder] if recorder is not None else []
        if greedy:
            kwargs = dict(do_sample=False)
        elif params.seed is not None:
            kwargs = dict(do_sample=False)
            processors.append(_SeededSampler(params.seed, row_index, params.temperature, dev))
        else:
            kwargs = dict(do_sample=True, temperature=params.temperature, top_p=params.top_p, top_k=0)
        seq = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max(max_new), pad_token_id=pad,
            eos_token_id=sorted(self.eos_ids), logits_processor=LogitsProcessorList(processors),
            stopping_criteria=StoppingCriteriaList([_StopOnText(self.tokenizer, stop, width)] if stop else []),
            synced_gpus=False,
            **kwargs)
        completion = seq[:, width:].cpu()
        logps = recorder.finish(completion) if recorder is not None and completion.shape[1] else None
        out = []
        for r in range(len(rows)):
            n, why = end_of_turn(completion[r].tolist(), self.eos_ids, stop, self.tokenizer, max_new[r])
            out.append(Sample(completion[r, :n].tolist(), None if logps is None else logps[r, :n].tolist(), why))
        return out
