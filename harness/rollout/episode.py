"""Multi-turn episode rollouts with a tool (``tools=calculator`` / ``search``), on any backend.

An episode is up to ``rollout.max_turns`` model turns. A turn samples until EOS, until the model
closes a tool call or until the episode's budget; after a turn that made a call the harness runs
the tool (:class:`harness.tools.ToolRunner`) and appends the observation, and the next turn
continues from there. ``tools.format`` (:mod:`harness.tools.formats`) says what a call and an
observation look like: ``tags`` (the default) stops a turn at the stop string ``tools.call_close``
and appends ``result_open + output + result_close``; ``chat_template`` reads hermes
``<tool_call>`` JSON from a turn that ended at EOS and appends the chat template's tool message and
next generation prompt.
One budget, ``rollout.max_new_tokens``, bounds the model's and the observations' tokens together
(an observation that does not fit is cut and ends the episode).

**Token-in/token-out** (the fix of TRL #5224 / slime #1418 class bugs): the backend receives the
token ids of prompt + earlier turns and returns the ids it sampled
(:meth:`harness.rollout.base.RolloutBackend.sample_ids`); the observation text is tokenized
alone and its ids appended. Nothing sampled is ever decoded and re-encoded, so the training
sequence is exactly the sampled ids plus the observations' ids. The observation tokens are
marked in :attr:`RolloutBatch.observation_mask`: attended to, never trained on (loss mask 0,
sampler log-prob 0, no KL), as prime-rl masks observations and Search-R1 masks retrieved tokens
(Jin et al. 2025, sec 3.1).

The rows are those of the single-turn :meth:`generate` (group-major, the same prompt ids); row
``r``'s turn ``t`` is seeded by ``(turn_seed(seed, t), row_offset + r)``, so an episode does not
depend on batching, the other rows or the number of data-parallel ranks.
"""

from __future__ import annotations

import dataclasses

import torch

from harness.rollout.base import RolloutBatch, SamplingParams
from harness.rollout.hf import row_seed
from harness.tools import ToolRunner
from harness.tools.formats import build_format


def turn_seed(seed: int | None, turn: int) -> int | None:
    """The sampling seed of turn ``turn`` (the call's own seed for turn 0; None stays None)."""
    if seed is None or turn == 0:
        return seed
    return row_seed(seed, -turn)  # a namespace no row index uses


class EpisodeRollout:
    """A backend wrapper with the backend protocol (``generate``, ``sync_weights``) whose rows are
    episodes with ``tool``.

    Args:
        backend: a backend with :meth:`sample_ids` (``hf``, ``vllm``).
        tokenizer: the policy's tokenizer.
        tool: the tool's runner (its params carry the call format).
        max_turns: model turns per episode (``rollout.max_turns``, >= 1).
    Raises:
        ValueError: ``max_turns`` < 1.
    """

    def __init__(self, backend, tokenizer, tool: ToolRunner, max_turns: int):
        if max_turns < 1:
            raise ValueError(f"rollout.max_turns={max_turns}: expected >= 1")
        self.backend, self.tokenizer, self.tool, self.max_turns = backend, tokenizer, tool, max_turns
        self.format = build_format(tool, tokenizer)  # tools.format: how calls are read and observations written
        self.eos_ids = backend.eos_ids

    def sync_weights(self, model) -> None:
        self.backend.sync_weights(model)

    def close(self) -> None:
        """Close the tool's runner (its worker thread) and the backend (a vLLM engine)."""
        self.tool.close()
        if hasattr(self.backend, "close"):
            self.backend.close()

    @torch.no_grad()
    def generate(self, prompts: list[str], num_samples: int,
                 params: SamplingParams) -> RolloutBatch:  # cpu: a rollout batch lives on the CPU
        """``num_samples`` episodes per prompt, rows group-major (:class:`RolloutBatch` with
        ``observation_mask`` and ``episode`` counts).

        Raises:
            ValueError: empty ``prompts``, ``num_samples`` < 1, or ``top_p`` < 1.
        """
        if not prompts or num_samples < 1:
            raise ValueError(f"need prompts and num_samples >= 1, got {len(prompts)} prompts, {num_samples}")
        if params.top_p < 1:
            raise ValueError(f"top_p={params.top_p}: the trainer scores the full softmax; use top_p=1")
        tok, budget, stop = self.tokenizer, params.max_new_tokens, self.format.stop
        rows = [p for p in prompts for _ in range(num_samples)]
        enc = tok(rows, return_tensors="pt", padding=True, add_special_tokens=False)  # as the backends
        prompt_ids = [list(x) for x in tok(prompts, add_special_tokens=False)["input_ids"]]
        ep = _Episodes.start(len(rows), budget)
        for t in range(self.max_turns):
            active = [r for r in range(len(rows)) if not ep.done[r]]
            if not active:
                break
            turn_params = dataclasses.replace(params, seed=turn_seed(params.seed, t))
            outs = self.backend.sample_ids([prompt_ids[r // num_samples] + ep.ids[r] for r in active], turn_params,
                                           [budget - len(ep.ids[r]) for r in active], stop,
                                           [params.row_offset + r for r in active])
            for r, s in zip(active, outs):
                self._turn(ep, r, s, last=t == self.max_turns - 1, budget=budget)
        return ep.batch(tok, enc, num_samples, greedy=params.temperature == 0)

    def _turn(self, ep: "_Episodes", r: int, s, last: bool, budget: int) -> None:
        """Row ``r`` takes the turn ``s`` (its sampled ids) and, when the turn made a call and the
        episode goes on, the tool's observation."""
        ep.ids[r] += s.ids
        ep.obs[r] += [0] * len(s.ids)
        ep.logps[r] += s.logprobs if s.logprobs is not None else [0.0] * len(s.ids)
        ep.turns[r] += 1
        ep.eos[r] = s.stop == "eos"
        made = self.format.calls(s.ids, s.stop)  # None: no call, the episode's answer ends here
        if made is None or last or len(ep.ids[r]) >= budget:
            ep.done[r] = True
            ep.eos[r] = ep.eos[r] and made is None  # a call left unanswered is a truncated episode
            return
        observations = [self.tool.observe(c) if isinstance(c, str) else c for c in made]
        ep.calls[r] += len(observations)
        ep.errors[r] += sum(o.error for o in observations)
        o = list(self.tokenizer(self.format.observation(observations), add_special_tokens=False)["input_ids"])
        o = o[: budget - len(ep.ids[r])]
        ep.ids[r] += o
        ep.obs[r] += [1] * len(o)
        ep.logps[r] += [0.0] * len(o)
        ep.eos[r] = False  # the episode goes on (or its budget ran out in the observation)
        ep.done[r] = len(ep.ids[r]) >= budget


@dataclasses.dataclass
class _Episodes:
    """The rows' episodes as they grow: token ids, observation flags (1 = a tool's token), sampler
    log-probs, and per row the turns, calls, tool errors, whether it is done and ended at EOS."""

    ids: list
    obs: list
    logps: list
    turns: list
    calls: list
    errors: list
    done: list
    eos: list

    @classmethod
    def start(cls, rows: int, budget: int) -> "_Episodes":
        return cls([[] for _ in range(rows)], [[] for _ in range(rows)], [[] for _ in range(rows)],
                   [0] * rows, [0] * rows, [0] * rows, [budget <= 0] * rows, [False] * rows)

    def batch(self, tok, enc, num_samples: int, greedy: bool) -> RolloutBatch:  # cpu: a rollout batch lives on the CPU
        """The episodes as a :class:`RolloutBatch` (right-padded; no sampler log-probs when greedy)."""
        B, ids = len(self.ids), self.ids
        tc = max(1, max(len(x) for x in ids))
        completion = torch.full((B, tc), tok.pad_token_id, dtype=torch.long)
        cmask = torch.zeros((B, tc), dtype=torch.long)
        omask = torch.zeros((B, tc), dtype=torch.long)
        sampler = torch.zeros((B, tc), dtype=torch.float32)
        for r in range(B):
            n = len(ids[r])
            completion[r, :n] = torch.tensor(ids[r], dtype=torch.long)
            cmask[r, :n] = 1
            omask[r, :n] = torch.tensor(self.obs[r], dtype=torch.long)
            sampler[r, :n] = torch.tensor(self.logps[r], dtype=torch.float32)
        texts = [tok.decode(x, skip_special_tokens=True) for x in ids]
        episode = {"turns": torch.tensor(self.turns), "tool_calls": torch.tensor(self.calls),
                   "tool_errors": torch.tensor(self.errors)}
        return RolloutBatch(enc["input_ids"], enc["attention_mask"], completion, cmask,
                            torch.tensor([not e for e in self.eos], dtype=torch.bool), texts, num_samples,
                            None if greedy else sampler, omask, episode)


def episode_metrics(episode: dict, correct: torch.Tensor) -> dict:
    """``rollout/*`` episode metrics of a batch (global rows).

    Args:
        episode: ``turns``, ``tool_calls``, ``tool_errors``, ``observation_tokens``, ``[N]`` each.
        correct: ``[N]`` bool, the verifier's verdicts.
    Returns:
        ``rollout/turns_mean``, ``rollout/tool_calls_mean`` (per episode), ``rollout/tool_errors``
        (the batch's count), ``rollout/observation_tokens_mean`` (per episode),
        ``rollout/tool_call_rate`` (fraction of episodes with a call) and
        ``rollout/accuracy_with_tool`` / ``rollout/accuracy_without_tool`` (accuracy of the
        episodes with / without a call; left out when there are none).
    """
    n = max(int(correct.shape[0]), 1)
    called = episode["tool_calls"] > 0
    out = {"rollout/turns_mean": float(episode["turns"].sum()) / n,
           "rollout/tool_calls_mean": float(episode["tool_calls"].sum()) / n,
           "rollout/tool_errors": float(episode["tool_errors"].sum()),
           "rollout/observation_tokens_mean": float(episode["observation_tokens"].sum()) / n,
           "rollout/tool_call_rate": float(called.sum()) / n}
    correct = correct.bool()
    if called.any():
        out["rollout/accuracy_with_tool"] = float(correct[called].float().mean())
    if (~called).any():
        out["rollout/accuracy_without_tool"] = float(correct[~called].float().mean())
    return out
