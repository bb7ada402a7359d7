"""Rewards from verdicts: the outcome reward, optional format reward, DAPO overlong shaping, step rewards.

Every component is returned separately so the trainer logs each one.

The outcome reward is registered by name (``reward=<name>``, :data:`OUTCOME_REWARDS`): a function
``fn(correct [B], key: RewardKey, p) -> outcome [B]`` and its params dataclass. ``verifier`` (the
default) is the verifier's verdict; ``random`` ignores the answer (a negative control).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np
import torch

from harness.algo import KLTerm
from harness.registry import Registry
from harness.verifiers import summarize

OUTCOME_REWARDS: Registry = Registry("reward")


@dataclass(frozen=True)
class RewardKey:
    """Names each completion of one scored batch, for an outcome reward that draws random numbers.

    Attributes:
        seed: the run's ``seed``.
        position: the data position of the draw's first prompt: the step's draw (step ``t`` starts
            at ``t * train.prompts_per_step`` without a group filter; each ``group_filter=dapo``
            round starts at its own position).
        first_row: the batch's first completion in the whole draw (all ranks; rows problem-major).
        stream: 0 for the sampled completions, 1 for the greedy ones an estimator scores (ReMax).
    """

    seed: int
    position: int
    first_row: int = 0
    stream: int = 0


@dataclass
class VerifierRewardParams:
    """``reward=verifier``: the task's verifier decides, 1.0 where it accepted the answer."""

    name: str = "verifier"


@OUTCOME_REWARDS.register("verifier", params=VerifierRewardParams)
def verifier_reward(correct: torch.Tensor, key: RewardKey, p: VerifierRewardParams) -> torch.Tensor:
    """The verifier's verdicts unchanged. Shapes: ``[B]`` -> ``[B]``."""
    return correct


@dataclass
class RandomRewardParams:
    """``reward=random``: a reward that ignores the answer (Shao et al. 2025, "Spurious Rewards:
    Rethinking Training Signals in RLVR", arXiv 2506.10947: Bernoulli(gamma), gamma = 0.5)."""

    name: str = "random"
    p: float = 0.5  # probability of reward 1 for each completion


@OUTCOME_REWARDS.register("random", params=RandomRewardParams)
def random_reward(correct: torch.Tensor, key: RewardKey, p: RandomRewardParams) -> torch.Tensor:
    """Bernoulli(``p.p``) per completion, independent of the completion and of ``correct``: row ``i``
    draws from numpy's generator seeded by ``(stream, seed, position, first_row + i)``, so the same
    completion of the same step gets the same reward after a resume, under any number of ranks and
    whatever the batch's split, and different rows, steps, seeds and streams draw independently.

    Shapes: ``correct`` ``[B]`` (only its length is read) -> ``[B]`` float32 of 0 / 1.

    Raises:
        ValueError: ``reward.p`` outside [0, 1], or a negative seed or position (naming it).
    """
    if not 0.0 <= p.p <= 1.0:
        raise ValueError(f"reward.p must be in [0, 1], got {p.p}")
    if key.seed < 0 or key.position < 0 or key.first_row < 0:
        raise ValueError(f"reward=random needs a seed, data position and row >= 0, got {key}")
    u = [np.random.default_rng([key.stream, key.seed, key.position, key.first_row + i]).random()
         for i in range(correct.shape[0])]
    # cpu: host draws, like the verifier's verdicts they replace
    return torch.tensor([float(x < p.p) for x in u], dtype=torch.float32)


def outcome_reward(cfg) -> Callable[[torch.Tensor, RewardKey], torch.Tensor]:
    """``fn(correct, key)`` of the run's ``reward`` node ``cfg`` (``cfg.reward`` of the run: name and params).

    Raises:
        ValueError: an unknown reward name (lists the valid ones) or an unknown parameter.
    """
    entry = OUTCOME_REWARDS.spec(cfg.name)
    params = entry.build(cfg)
    return lambda correct, key: entry.fn(correct, key, params)


@dataclass
class RewardOutput:
    """Per-completion rewards, all ``[B]`` float32.

    Attributes:
        rewards: total = outcome + format_weight * formatted + overlong penalty.
        correct: 1.0 where the verifier accepted the answer.
        formatted: 1.0 where the expected answer format was present.
        overlong: the (non-positive) DAPO soft overlong penalty.
        verifier: counts of verifier timeouts / errors.
        outcome: the outcome reward (``reward=``): ``correct`` under ``reward=verifier``; None means
            ``correct``.
    """

    rewards: torch.Tensor
    correct: torch.Tensor
    formatted: torch.Tensor
    overlong: torch.Tensor
    verifier: dict = field(default_factory=dict)
    outcome: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        if self.outcome is None:
            self.outcome = self.correct


# the per-completion fields of RewardOutput, in order (rows selected, concatenated, gathered together)
REWARD_ROWS = ("rewards", "correct", "formatted", "overlong", "outcome")


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float) -> torch.Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13).

    0 for ``len <= L_max - buffer``; ``-(len - (L_max - buffer)) / buffer * penalty`` inside
    the buffer; ``lengths`` in tokens, ``[B]``. ``buffer == 0`` disables it.
    """
    if buffer <= 0:
        return torch.zeros_like(lengths, dtype=torch.float32)
    start = max_new_tokens - buffer
    return -((lengths.float() - start).clamp(min=0) / buffer).clamp(max=1.0) * penalty


def compute_rewards(task, texts: list[str], golds: list[str], lengths: torch.Tensor, *,
                    format_weight: float, max_new_tokens: int, overlong_buffer: int = 0,
                    overlong_factor: float = 1.0, outcome=None, key: Optional[RewardKey] = None) -> RewardOutput:
    """Score completions with the task's verifier and combine the components.

    Args:
        task: a :class:`harness.tasks.Task`.
        texts, golds: ``B`` completions and their gold answers.
        lengths: ``[B]`` completion lengths in tokens.
        outcome: ``fn(correct, key) -> [B]`` (:func:`outcome_reward`); None: the verifier's verdict.
        key: the batch's :class:`RewardKey` (needed by an outcome that draws random numbers).
    """
    verdicts = task.score(texts, golds)
    # cpu: the verifier's verdicts, host values; rewards live with the CPU rollout batch
    correct = torch.tensor([float(v.correct) for v in verdicts])
    # cpu: as above
    formatted = torch.tensor([float(v.formatted) for v in verdicts])
    over = overlong_penalty(lengths, max_new_tokens, overlong_buffer, overlong_factor)
    out = correct if outcome is None else outcome(correct, key)
    total = out + format_weight * formatted + over
    return RewardOutput(total, correct, formatted, over, summarize(verdicts), out)


def shape_rewards(rewards: torch.Tensor, mask: torch.Tensor, old_logprobs, ref_logprobs, kl: KLTerm, beta=None):
    """Sequence scores and per-token rewards the advantage estimator sees.

    Args:
        rewards: ``[B]`` total reward of each completion; mask: ``[B, T]`` completion mask.
        old_logprobs, ref_logprobs: ``[B, T]`` behaviour and reference log-probs, or None.
        kl: the run's KL term (``algo.kl``, :class:`harness.algo.KLTerm`: placement, form, clamp, beta).
        beta: the step's KL coefficient (the KL controller's; ``kl.beta`` when None).
    Returns:
        ``(scores [B], token_rewards [B, T])``: the outcome reward sits on each row's last valid
        token, the last 1 of ``mask`` (a tool episode's mask has holes; 0 for an empty row). With ``kl.placement=reward`` and a reference, the per-token
        KL estimate ``k(old, ref)`` times ``beta`` is subtracted from every token's reward and its
        row sum from the score (InstructGPT-style KL in the reward; verl ``use_kl_in_reward``).
    """
    lengths = mask.sum(1).long()
    token_rewards = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    last = (mask.shape[1] - 1 - mask.flip(1).long().argmax(1)) * (lengths > 0)  # right-padded: lengths - 1
    token_rewards[torch.arange(len(lengths), device=mask.device), last] = rewards * (lengths > 0).float()
    scores = rewards.clone().float()
    if ref_logprobs is not None and kl.placement == "reward":
        beta = kl.beta if beta is None else beta
        kl_tok = kl.penalty(old_logprobs, ref_logprobs) * mask
        token_rewards = token_rewards - beta * kl_tok
        scores = scores - beta * kl_tok.sum(1)
    return scores, token_rewards


def token_end_offsets(tokenizer, ids: list[int]) -> list[int]:
    """Character offset in the decoded text where each token ends (``len(ids)`` entries)."""
    ends, total = [], 0
    for t in ids:
        total += len(tokenizer.decode([t], skip_special_tokens=True))
        ends.append(total)
    return ends


def process_step_rewards(task, tokenizer, texts, completion_ids, mask, outcome: torch.Tensor):
    """Map each completion's step rewards (char offsets) to token indices for ``process``.

    The outcome reward is added to the final step (the last valid token), as in DeepSeekMath
    sec 4.1.3 where the final answer step carries the outcome.

    Returns:
        per row, a list of ``(token_index_where_step_ends, reward)``.
    """
    out = []
    for b, text in enumerate(texts):
        n = int(mask[b].sum())
        if n == 0:
            out.append([])
            continue
        ends = token_end_offsets(tokenizer, completion_ids[b, :n].tolist())
        steps = []
        for char_end, r in task.step_rewards(text):
            tok = next((i for i, e in enumerate(ends) if e >= char_end), n - 1)
            steps.append((tok, float(r)))
        if steps and steps[-1][0] == n - 1:
            steps[-1] = (n - 1, steps[-1][1] + float(outcome[b]))
        else:
            steps.append((n - 1, float(outcome[b])))
        out.append(steps)
    return out


def select_rewards(rew: RewardOutput, rows) -> RewardOutput:  # cpu: rewards live with the CPU rollout batch
    """The rows ``rows`` of each component."""
    idx = torch.as_tensor(rows, dtype=torch.long)
    return RewardOutput(**{f: getattr(rew, f)[idx] for f in REWARD_ROWS}, verifier=rew.verifier)


def empty_rewards() -> RewardOutput:  # cpu: rewards live with the CPU rollout batch
    """No rows (a rank whose groups were all filtered out)."""
    return RewardOutput(**{f: torch.zeros(0) for f in REWARD_ROWS}, verifier={"verifier/timeouts": 0, "verifier/errors": 0})


def cat_rewards(rews) -> RewardOutput:
    """The rows of ``rews`` in order; the verifier counts summed."""
    verifier: dict = {}
    for r in rews:
        for k in ("verifier/timeouts", "verifier/errors"):
            verifier[k] = verifier.get(k, 0) + r.verifier.get(k, 0)
    return RewardOutput(**{f: torch.cat([getattr(r, f) for r in rews]) for f in REWARD_ROWS}, verifier=verifier)
