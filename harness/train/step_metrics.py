"""A training step's logged metrics, assembled in one place.

The trainer hands over what the step computed on this rank (:class:`StepOutputs`). One call,
:meth:`StepOutputs.gather`, makes every cross-rank gather and reduction the metrics need and
returns the step's global quantities (:class:`StepTotals`); :func:`assemble` turns those into the
``train/*``, ``time/*``, ``perf/*``, ``verifier/*`` and ``rollout/*`` metrics without further
communication; :func:`step_metrics` is the two in a row. Under ``torchrun`` the metrics are those
of the global batch (rows gathered in rank order, counts summed, the slowest rank's times), so
they equal the one-process step's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.train.distributed import World
from harness.train.evaluation import completion_len_by_outcome
from harness.train.rewards import REWARD_ROWS, RewardOutput
from harness.rollout import RolloutBatch
from harness.rollout.episode import episode_metrics

STEP_TIMES = ("time/logprob_s", "time/old_logprob_s", "time/ref_logprob_s", "time/value_s", "time/update_s",
              "time/step_s", "time/weight_sync_s")
"""The phases the trainer times itself (seconds), in the order they are logged. ``time/rollout_s``
and ``time/reward_s`` come with the rollout's ``info``."""

_MISMATCH_SUMS = ("tokens", "abs_diff_sum", "ratio_sum", "past_cap")


@dataclass
class StepOutputs:
    """What one training step computed, as its metrics read it. ``b`` rows: this rank's; ``N`` rows:
    the global batch's (all ranks' rows in rank order); ``T``: completion tokens.

    Attributes:
        batch: this rank's rollout batch (``prompt_mask`` ``[b, Tp]``, ``truncated`` ``[b]``,
            ``group_size`` G).
        rewards: this rank's reward and its parts before ``length_penalty``, ``[b]`` each.
        shaped: ``[b]`` the reward after ``length_penalty``; ``rewards.rewards`` itself (the same
            object) when the penalty is the identity.
        mask: ``[N, T]`` the global completion mask (the estimator's, already gathered).
        advantages: ``[N, T]`` the estimator's advantages of the global batch.
        info: the rollout's counts (global already) and its ``time/rollout_s``, ``time/reward_s``
            (this rank's seconds).
        update_stats: the update's statistics (global already), logged as ``train/<name>``.
        controls: the trainer's own scalars, logged as given (``train/lr``, ``train/kl_coef``, ...).
        times: this rank's seconds for each of :data:`STEP_TIMES`.
        elapsed_s: the run's wall-clock seconds so far (resumes included), logged as given.
        padding_waste: this rank's :func:`harness.train.update.padding_waste`.
        param_frac: the share of the policy's parameters this rank holds.
        mismatch: this rank's :func:`harness.algo.mismatch_stats` over its loss tokens; None when
            not measured.
    """

    batch: RolloutBatch
    rewards: RewardOutput
    shaped: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    info: dict
    update_stats: dict
    controls: dict
    times: dict
    elapsed_s: float
    padding_waste: float
    param_frac: float
    mismatch: Optional[dict] = None

    def gather(self, w: World) -> "StepTotals":
        """Every cross-rank gather and reduction of the step's metrics, in one call.

        A collective: every rank calls it once per step. With one process it only regroups.
        """
        rew = self.rewards
        rewards = RewardOutput(**{f: w.gather_rows(getattr(rew, f)) for f in REWARD_ROWS}, verifier=w.sum_dict(rew.verifier))
        times = {**self.times, **{k: v for k, v in self.info.items() if k.startswith("time/")}}
        return StepTotals(
            rewards=rewards,
            shaped=w.gather_rows(self.shaped) if self.shaped is not rew.rewards else None,
            truncated=w.gather_rows(self.batch.truncated),
            prompt_tokens=float(w.sum(float(self.batch.prompt_mask.sum()))),
            padding_waste=w.sum(self.padding_waste) / w.world_size,
            param_frac=w.max(self.param_frac),
            times={k: w.max(v) for k, v in times.items()},  # the slowest rank sets the step's pace
            mismatch=_reduce_mismatch(w, self.mismatch) if self.mismatch is not None else None,
            world_size=w.world_size,
            episode=self._episode(w),
        )

    def _episode(self, w: World) -> Optional[dict]:
        """The episode counts of every row (``[N]`` each), or None for single-turn rollouts. A rank
        with no rows (all its groups filtered) contributes none."""
        b = self.batch
        if w.sum(int(b.episode is not None)) == 0:  # a collective: a rank with no rows has no counts
            return None
        local = dict(b.episode) if b.episode is not None else {
            # cpu: the CPU rollout batch's episode counts
            k: torch.zeros(0, dtype=torch.long) for k in ("turns", "tool_calls", "tool_errors")}
        obs = b.observation_mask if b.observation_mask is not None else torch.zeros_like(b.completion_mask)
        local["observation_tokens"] = obs.sum(1)
        return {k: w.gather_rows(v) for k, v in local.items()}


@dataclass
class StepTotals:
    """The step's quantities over all ranks (``N`` rows, rank order), from :meth:`StepOutputs.gather`.

    Attributes:
        rewards: the reward and its parts, ``[N]`` each; ``verifier`` counts summed.
        shaped: ``[N]`` the reward after ``length_penalty``; None when the penalty is the identity.
        truncated: ``[N]`` bool, no EOS within ``max_new_tokens``.
        prompt_tokens: real prompt tokens of the kept rows (one prompt per row).
        padding_waste: the mean over ranks of their padding fractions.
        param_frac: the largest rank's share of the policy's parameters.
        times: seconds, the slowest rank's: :data:`STEP_TIMES` and the rollout's ``time/*``.
        mismatch: the summed :func:`harness.algo.mismatch_stats` sums and the global
            ``abs_diff_max``, ``ratio_min``, ``ratio_max`` (those three only when there are tokens);
            None when not measured.
        world_size: the number of processes.
    """

    rewards: RewardOutput
    shaped: Optional[torch.Tensor]
    truncated: torch.Tensor
    prompt_tokens: float
    padding_waste: float
    param_frac: float
    times: dict
    mismatch: Optional[dict]
    world_size: int
    episode: Optional[dict] = None  # [N] per-row episode counts (turns, tool calls, errors, observation tokens)


def step_metrics(step: StepOutputs, w: World) -> dict:
    """The step's logged metrics: :meth:`StepOutputs.gather` (a collective: every rank calls it),
    then :func:`assemble`. Returns ``{name: float}``, the same on every rank."""
    return assemble(step, step.gather(w))


def assemble(step: StepOutputs, t: StepTotals) -> dict:
    """The step's metrics from its global quantities (no communication).

    Args:
        step: the step's outputs; only its global fields are read (``mask``, ``advantages``,
            ``info`` counts, ``update_stats``, ``controls``, ``elapsed_s``, ``batch.group_size``).
        t: :meth:`StepOutputs.gather` of ``step``.
    Returns:
        ``{name: float}``: rewards and their parts (means over the ``N`` completions), completion
        lengths (tokens), advantages, the trainer's controls, ``time/*`` (seconds), ``perf/*``
        (:func:`throughput` included), the rollout's counts, the update's statistics, verifier
        counts and ``rollout/*`` (:func:`mismatch_metrics`).
    """
    r, mask = t.rewards, step.mask
    lengths = mask.sum(1)
    n_tokens = float(mask.sum())
    metrics = {
        "train/reward_mean": float(r.rewards.mean()), "train/reward_std": float(r.rewards.std()),
        "train/accuracy": float(r.correct.float().mean()), "train/format_rate": float(r.formatted.float().mean()),
        "train/overlong_penalty": float(r.overlong.mean()),
        **({"train/length_penalty": float((t.shaped - r.rewards).mean())} if t.shaped is not None else {}),
        "train/frac_reward_zero_std": float((r.rewards.view(-1, step.batch.group_size).std(dim=1) == 0).float().mean()),
        "train/completion_len_mean": float(lengths.float().mean()),
        "train/completion_len_max": float(lengths.max()),
        **completion_len_by_outcome(lengths, r.correct, "train"),
        "train/clipped_ratio": float(t.truncated.float().mean()),
        "train/advantage_abs_mean": float((step.advantages.abs() * mask).sum() / max(n_tokens, 1)),
        **step.controls,
        **{k: step.times[k] for k in STEP_TIMES}, "time/elapsed_s": step.elapsed_s,
        "perf/tokens_per_s": n_tokens / t.times["time/step_s"], "perf/completion_tokens": n_tokens,
        "perf/param_shard_frac": t.param_frac, "perf/padding_waste": t.padding_waste,
        **step.info, **{f"train/{k}": v for k, v in step.update_stats.items()},
        "verifier/timeouts": r.verifier.get("verifier/timeouts", 0.0),
        "verifier/errors": r.verifier.get("verifier/errors", 0.0),
        **(mismatch_metrics(t.mismatch) if t.mismatch is not None else {}),
        **(episode_metrics(t.episode, r.correct) if t.episode is not None else {}),
    }
    metrics.update(t.times)  # every rank's own seconds above, replaced (in place) by the slowest rank's
    metrics.update(throughput(metrics, t.prompt_tokens + n_tokens, t.world_size))
    return metrics


def _reduce_mismatch(w: World, local: dict) -> dict:
    """Sums of :func:`harness.algo.mismatch_stats` over ranks, and its extremes when there are tokens."""
    out = w.sum_dict({k: local[k] for k in _MISMATCH_SUMS})
    if out["tokens"] != 0:
        out.update({"abs_diff_max": w.max(local["abs_diff_max"]), "ratio_min": -w.max(-local["ratio_min"]),
                    "ratio_max": w.max(local["ratio_max"])})
    return out


def mismatch_metrics(s: dict) -> dict:
    """``rollout/*``: how far the sampler's log-probs are from the trainer's under the same weights.

    Args:
        s: global sums and extremes of :func:`harness.algo.mismatch_stats` (``tokens``,
            ``abs_diff_sum``, ``ratio_sum``, ``past_cap``; ``abs_diff_max``, ``ratio_min``,
            ``ratio_max`` when ``tokens`` > 0).
    Returns:
        the mean and max of ``|log pi_trainer - log pi_sampler|`` (nats), the mean, min and max of
        the ratio ``rho`` and the fraction of tokens with ``rho`` past the cap; empty without tokens.
    """
    if s["tokens"] == 0:
        return {}
    return {"rollout/logprob_diff_mean": s["abs_diff_sum"] / s["tokens"],
            "rollout/logprob_diff_max": s["abs_diff_max"],
            "rollout/is_ratio_mean": s["ratio_sum"] / s["tokens"],
            "rollout/is_ratio_min": s["ratio_min"],
            "rollout/is_ratio_max": s["ratio_max"],
            "rollout/is_frac_past_cap": s["past_cap"] / s["tokens"]}


def throughput(m: dict, trained_tokens: float, processes: int) -> dict:
    """A step's throughput, named and defined as xtuner's RL trainer names them (tokens per
    process per second; per GPU on a GPU machine):

    * ``perf/rollout_tgs``: completion tokens generated (filtered groups' included,
      ``perf/rollout_tokens``) / generation time (``time/rollout_s``, the slowest rank's) / processes;
    * ``perf/training_tgs``: tokens trained on (real prompt + completion tokens of the kept rows,
      the prompt counted once per row) / training time (old, reference and value passes plus the
      update: ``time/logprob_s + time/update_s``) / processes;
    * ``perf/effective_tgs``: the same tokens / the whole step (``time/step_s``) / processes;
    * ``perf/weight_sync_frac``: ``time/weight_sync_s`` (loading the weights into the rollout
      engine; ~0 for the hf backend, which samples with the training module) / ``time/step_s``.

    A phase that took no time gives no rate (the key is left out, never logged as 0 or inf).
    """
    out = {"perf/weight_sync_frac": m["time/weight_sync_s"] / m["time/step_s"]}
    for key, tokens, seconds in (("perf/rollout_tgs", m["perf/rollout_tokens"], m["time/rollout_s"]),
                                 ("perf/training_tgs", trained_tokens, m["time/logprob_s"] + m["time/update_s"]),
                                 ("perf/effective_tgs", trained_tokens, m["time/step_s"])):
        if seconds > 0:
            out[key] = tokens / seconds / processes
    return out
