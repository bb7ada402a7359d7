"""The rollout interface: prompts in, sampled completions (token ids + masks) out.

A backend only generates; it never computes rewards or losses. ``hf`` (transformers
``generate`` on the policy module) and ``vllm`` (an in-process vLLM engine) implement the same
two methods; vLLM receives the policy's weights through :meth:`RolloutBackend.sync_weights`
after each update.

A backend is a class registered in :data:`BACKENDS` with its params (:class:`RolloutConfig` or a
subclass, the ``rollout=<name>`` config node), built as ``cls(model, tokenizer, params)``. Adding
one is a module in this package and a test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from harness.registry import Registry

# name -> backend class, with its RolloutConfig (sub)class as params; ``rollout=<name>`` picks one
BACKENDS: Registry = Registry("rollout backend", name_field="backend")


@dataclass
class RolloutConfig:
    """Sampling for training rollouts (``rollout=hf``). ``batch_size``: sequences per ``generate`` call (0 = all).

    The fields every backend has; a backend with keys of its own subclasses it.
    """

    backend: str = "hf"
    temperature: float = 1.0
    top_p: float = 1.0  # nucleus sampling in (0, 1]; 1.0 = off (harness.model.truncation: convention, keep set)
    top_k: int = 0  # keep the k most probable tokens (ties with the k-th kept); 0 = off
    max_new_tokens: int = 128
    batch_size: int = 0
    progress: bool = True
    share_prefix: bool = True  # prefill each distinct prompt once, copy its KV cache to the group
    # sample step t's rollouts with the weights of k updates ago (harness.train.staleness; 0 = on-policy)
    staleness: int = 0
    # with staleness >= 1: generate the next step's rollouts in a background thread while this step
    # trains (harness.train.overlap); the same batches as overlap=false, same seeds
    overlap: bool = False
    max_turns: int = 4  # with a tool (tools=...): model turns per episode; max_new_tokens bounds them all


@dataclass
class SamplingParams:
    """Sampling settings. ``temperature == 0`` means greedy; ``max_new_tokens`` in tokens.
    ``top_k`` / ``top_p``: draw from the distribution renormalised over the keep set
    (:mod:`harness.model.truncation`), applied after temperature; the sampler's log-probs are over it too.

    ``seed``: when set, row ``r`` of a ``generate`` call (``r = prompt * n + sample``) draws its
    tokens from its own generator seeded by ``(seed, r)``, so its completion does not depend on
    how the rows are split into batches (``rollout.batch_size``), on prefix sharing or on other
    rows; None uses torch's global generator. ``row_offset`` is the index of this call's first row
    in a larger logical batch that the caller splits into several calls (evaluation does).

    ``purpose``: ``rollout`` (the trainer's draws) or ``eval`` (:func:`harness.train.evaluation.evaluate`,
    the measurement); a backend may decode the two in different dtypes (``rollout=lean``'s
    ``dtype`` and ``eval_dtype``); the others decode both alike.
    """

    temperature: float = RolloutConfig.temperature  # the defaults are the rollout config's
    top_p: float = RolloutConfig.top_p
    top_k: int = RolloutConfig.top_k
    max_new_tokens: int = RolloutConfig.max_new_tokens
    seed: int | None = None
    row_offset: int = 0
    purpose: str = "rollout"


@dataclass
class RolloutBatch:
    """Completions for ``P`` prompts x ``G`` samples, rows group-major (row ``p*G + g``).

    Attributes:
        prompt_ids: ``[B, Tp]`` left-padded prompt token ids.
        prompt_mask: ``[B, Tp]`` 1 for real prompt tokens.
        completion_ids: ``[B, Tc]`` right-padded completion ids (EOS included when emitted).
        completion_mask: ``[B, Tc]`` 1 for completion tokens up to and including EOS.
        truncated: ``[B]`` bool, True where no EOS came within ``max_new_tokens``.
        texts: ``B`` decoded completions (special tokens removed).
        group_size: G.
        sampler_logprobs: ``[B, Tc]`` float32 log-probability of each sampled token under the
            distribution the sampler drew it from (after temperature, renormalised over the
            top-k / top-p keep set), 0 past the mask; None
            when the backend does not report them (greedy decoding).
        observation_mask: ``[B, Tc]`` long, 1 on the tool observations' tokens an episode rollout
            (:mod:`harness.rollout.episode`) appended between the model's turns; None when no tool
            ran (single-turn rollouts). Those tokens are attended to (``completion_mask``) but not
            trained on (:attr:`loss_mask`), and have sampler log-prob 0.
        episode: per-row episode counts (``[B]`` long each: ``turns``, ``tool_calls``,
            ``tool_errors``); None for single-turn rollouts.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    truncated: torch.Tensor
    texts: list[str]
    group_size: int
    sampler_logprobs: torch.Tensor | None = None
    observation_mask: torch.Tensor | None = None
    episode: dict | None = None

    @property
    def num_sequences(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def loss_mask(self) -> torch.Tensor:
        """``[B, Tc]`` the tokens the algorithm sees (estimators, losses, KL, corrections,
        aggregations): the model's own tokens, i.e. ``completion_mask`` without the observation
        tokens; ``completion_mask`` itself (the same object) when there are none."""
        if self.observation_mask is None:
            return self.completion_mask
        return self.completion_mask * (1 - self.observation_mask)

    def select(self, rows: torch.Tensor | list[int]) -> "RolloutBatch":
        """A new batch with only ``rows`` (whole groups; used by dynamic sampling)."""
        # cpu: row indices of the CPU rollout batch
        rows = torch.as_tensor(rows, dtype=torch.long)
        return RolloutBatch(
            self.prompt_ids[rows], self.prompt_mask[rows], self.completion_ids[rows],
            self.completion_mask[rows], self.truncated[rows],
            [self.texts[i] for i in rows.tolist()], self.group_size,
            None if self.sampler_logprobs is None else self.sampler_logprobs[rows],
            None if self.observation_mask is None else self.observation_mask[rows],
            None if self.episode is None else {k: v[rows] for k, v in self.episode.items()},
        )


def concat_batches(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Concatenate batches along rows, re-padding prompts (left) and completions (right)."""
    if len(batches) == 1:
        return batches[0]
    tp = max(b.prompt_ids.shape[1] for b in batches)
    tc = max(b.completion_ids.shape[1] for b in batches)

    def lpad(x, t, v):
        return torch.nn.functional.pad(x, (t - x.shape[1], 0), value=v)

    def rpad(x, t, v):
        return torch.nn.functional.pad(x, (0, t - x.shape[1]), value=v)

    return RolloutBatch(
        torch.cat([lpad(b.prompt_ids, tp, pad_id) for b in batches]),
        torch.cat([lpad(b.prompt_mask, tp, 0) for b in batches]),
        torch.cat([rpad(b.completion_ids, tc, pad_id) for b in batches]),
        torch.cat([rpad(b.completion_mask, tc, 0) for b in batches]),
        torch.cat([b.truncated for b in batches]),
        [t for b in batches for t in b.texts],
        batches[0].group_size,
        None if any(b.sampler_logprobs is None for b in batches)
        else torch.cat([rpad(b.sampler_logprobs, tc, 0.0) for b in batches]),
        None if all(b.observation_mask is None for b in batches)
        else torch.cat([rpad(b.observation_mask if b.observation_mask is not None
                             else torch.zeros_like(b.completion_mask), tc, 0) for b in batches]),
        None if any(b.episode is None for b in batches)
        else {k: torch.cat([b.episode[k] for b in batches]) for k in batches[0].episode},
    )


def empty_batch(group_size: int, pad_id: int) -> RolloutBatch:  # cpu: a rollout batch lives on the CPU
    """A batch of 0 rows (a data-parallel rank whose groups were all filtered out this step)."""
    z = torch.full((0, 1), pad_id, dtype=torch.long)
    return RolloutBatch(z, torch.zeros((0, 1), dtype=torch.long), z.clone(), torch.zeros((0, 1), dtype=torch.long),
                        torch.zeros(0, dtype=torch.bool), [], group_size)


class RolloutBackend(Protocol):
    """What the trainer needs from a generator."""

    def generate(self, prompts: list[str], num_samples: int, params: SamplingParams) -> RolloutBatch:
        """Sample ``num_samples`` completions per prompt; rows group-major."""
        ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the policy's current weights (no-op when the backend shares the module)."""
        ...

    def sample_ids(self, rows: list[list[int]], params: SamplingParams, max_new: list[int], stop: str | None,
                   row_index: list[int]) -> list["Sample"]:
        """One model turn of an episode (:mod:`harness.rollout.episode`): token ids in, token ids out.

        Row ``i`` continues ``rows[i]`` (prompt + earlier turns' ids, unpadded) by at most
        ``max_new[i]`` tokens, stopping after EOS or after the token that completes the text
        ``stop`` (None: EOS only); seeded by ``params.seed`` and ``row_index[i]`` as :class:`SamplingParams` says.
        """
        ...


@dataclass
class Sample:
    """One row's turn from :meth:`RolloutBackend.sample_ids`.

    Attributes:
        ids: the sampled token ids, in order (EOS or the stop string's last token included).
        logprobs: the sampler's log-prob of each (after temperature); None under greedy decoding.
        stop: why the turn ended: ``"eos"``, ``"stop"`` (the stop string was completed) or
            ``"length"`` (``max_new`` tokens).
    """

    ids: list[int]
    logprobs: list[float] | None
    stop: str


def end_of_turn(ids: list[int], eos_ids: set[int], stop: str | None, tokenizer, max_new: int) -> tuple[int, str]:
    """Where a turn's sampled ``ids`` end: ``(length, reason)``.

    The turn ends at the first EOS (kept), else at the first token whose arrival makes the decoded
    text of the turn contain ``stop`` (None: no stop string; kept; a token may carry text past the stop string, it is
    kept whole: the ids are never re-tokenized), else after ``max_new`` tokens. Both backends cut
    their output with this rule, so a turn is the same tokens whichever backend sampled it.

    Returns:
        (number of ids kept, ``"eos"`` | ``"stop"`` | ``"length"``).
    """
    ids = ids[:max_new]
    text_len = 0
    for k, t in enumerate(ids):
        if t in eos_ids:
            return k + 1, "eos"
        if not stop:
            continue
        # a token can complete the stop string only if it adds text: decode the tail once it might
        text = tokenizer.decode(ids[: k + 1])
        if len(text) != text_len and stop in text[max(0, text_len - len(stop)) :]:
            return k + 1, "stop"
        text_len = len(text)
    return len(ids), "length"
