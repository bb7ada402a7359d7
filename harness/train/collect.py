"""The step's training batch, a part of :class:`harness.train.trainer.Trainer`: prompts drawn from the
task at the data position, sampled by the rollout backend, scored, and filtered by groups
(``group_filter=``), with stale (``rollout.staleness``) and overlapped (``rollout.overlap``)
rollouts; also the greedy completions an estimator may need."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

import torch

from harness.rollout import RolloutBatch, SamplingParams, concat_batches, empty_batch
from harness.train.distributed import full_weights
from harness.train.rewards import RewardKey, RewardOutput, cat_rewards, compute_rewards, empty_rewards, select_rewards


class CollectMixin:
    """The :class:`harness.train.trainer.Trainer` methods that collect the step's batch; they use
    the trainer's attributes (``cfg``, ``task``, ``tok``, ``backend``, ``algo``, ``world``,
    ``lagged``, ``overlap``, ``data_pos``, ``step``)."""

    def _sampling(self, data_pos: Optional[int] = None) -> SamplingParams:
        """Training sampling, seeded by (``seed``, data position; default: :attr:`data_pos`): each draw
        of prompts gets its own seed, the same after a resume and whatever ``rollout.batch_size`` or
        prefix sharing is."""
        r, pos = self.cfg.rollout, self.data_pos if data_pos is None else data_pos
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens,
                              seed=self.cfg.seed * 1_000_003 + pos)

    def collect(self):
        """Sample P prompts x G completions, score them and apply the group filter
        (``group_filter=<name>``; DAPO's dynamic sampling resamples dropped groups).

        Data-parallel: each round's prompts are split into contiguous per-rank shares
        (:meth:`harness.train.distributed.World.shard`); a rank samples its rows with the row offsets
        they have in the whole draw, so a completion does not depend on the number of ranks, and
        the filter's decisions (groups kept, another round, the fallback) use global counts.

        Returns:
            (this rank's rollout batch, its reward output, its problems, info dict with global counts).
        """
        with full_weights(self.policy):  # sharded: every rank gathers the weights, even one with no prompts
            batch, rew, problems, info, self.data_pos = self._collect(self.data_pos)
        return batch, rew, problems, info

    def _collect(self, data_pos: int):
        """:meth:`collect` from data position ``data_pos``, changing no state of the trainer (the
        ``rollout.overlap`` worker runs it, :mod:`harness.train.overlap`); also returns the position after it."""
        cfg, G, P, w = self.cfg, self.cfg.group_size, self.cfg.train.prompts_per_step, self.world
        rounds = self.algo.group_filter.params.max_rounds
        kept, kept_rewards, kept_problems, t_roll, t_rew, sampled = [], [], [], 0.0, 0.0, 0
        kept_global, generated = 0, 0
        for round_ in range(rounds):
            need = P - kept_global
            share = w.shard(need)
            problems = [self.task.train_problem(data_pos + i, cfg.seed) for i in share]
            sampling = dataclasses.replace(self._sampling(data_pos), row_offset=share.start * G)
            key = RewardKey(cfg.seed, data_pos, first_row=share.start * G)
            data_pos += need
            sampled += need
            batch = rew = None
            # cpu: a row mask of the CPU rollout batch
            keep = torch.zeros(0, dtype=torch.bool)
            if problems:
                t0 = time.perf_counter()
                batch = self.backend.generate([self.task.prompt(p, self.tok) for p in problems], G, sampling)
                t1 = time.perf_counter()
                generated += int(batch.completion_mask.sum())  # filtered groups' tokens included
                rew = self._score(batch, problems, G, key)
                t_roll, t_rew = t_roll + (t1 - t0), t_rew + (time.perf_counter() - t1)
                keep = self.algo.group_filter(rew.rewards.view(-1, G))
            n_keep = w.sum(int(keep.sum()))
            if n_keep < need:
                if n_keep == 0:
                    if round_ < rounds - 1 or kept_global:
                        continue
                    # cpu: a row mask of the CPU rollout batch
                    keep = torch.ones(len(problems), dtype=torch.bool)  # nothing kept at all: train on the last draw
                    n_keep = need
                groups = [i for i in range(len(problems)) if keep[i]]
                if problems and len(groups) < len(problems):
                    rows = [i * G + g for i in groups for g in range(G)]
                    batch, problems = batch.select(rows), [problems[i] for i in groups]
                    rew = select_rewards(rew, rows)
            if problems:
                kept.append(batch)
                kept_rewards.append(rew)
                kept_problems.append(problems)
            kept_global += n_keep
            if kept_global >= P:
                break
        if kept:
            batch, rew = concat_batches(kept, self.tok.pad_token_id), cat_rewards(kept_rewards)
        else:  # data-parallel: every group of this rank was filtered out
            batch, rew = empty_batch(G, self.tok.pad_token_id), empty_rewards()
        problems = [p for ps in kept_problems for p in ps]
        info = {"train/groups_kept": kept_global, "time/rollout_s": t_roll, "time/reward_s": t_rew,
                # updates between the weights that sampled (every row: one version) and the trained ones
                "rollout/staleness_mean": float(self.lagged.lag(self.step)) if self.lagged is not None else 0.0,
                "train/prompts_sampled": sampled, "perf/rollout_tokens": float(w.sum(generated))}
        return batch, rew, problems, info, data_pos

    def _next_batch(self):
        """This step's rollouts (:meth:`collect`'s four), and ``time/rollout_wait_s`` in the info: the
        seconds the step waited for them. ``rollout.overlap``: the batch the worker generated during the
        previous step when one is pending (the wait is what was left of it), else collected now (the
        wait is the whole collection); then the next step's generation starts (:mod:`harness.train.overlap`)."""
        t0 = time.perf_counter()
        if self.overlap is not None and self.overlap.pending:
            version, (batch, rew, problems, info, self.data_pos), waited = self.overlap.take(self.data_pos)
            # the worker read the step counter while this thread moved it: the lag of the version it sampled with
            info["rollout/staleness_mean"] = float(self.step - version)
        else:
            batch, rew, problems, info = self.collect()
            waited = time.perf_counter() - t0
        info["time/rollout_wait_s"] = waited
        if self.overlap is not None and self.step + 1 < self.cfg.train.steps:
            self.overlap.submit(self._collect, self.data_pos, self.step)
        return batch, rew, problems, info

    def _score(self, batch: RolloutBatch, problems: list, n: int, key: RewardKey) -> RewardOutput:
        """The rewards of ``batch``'s completions, ``n`` per problem (rows problem-major), ``[B]``
        each: the outcome reward (``reward=``; ``key`` names the rows), the format bonus and the
        overlong penalty."""
        cfg = self.cfg
        return compute_rewards(self.task, batch.texts, [p.gold for p in problems for _ in range(n)],
                               batch.completion_mask.sum(1), format_weight=cfg.task.format_reward,
                               max_new_tokens=cfg.rollout.max_new_tokens, overlong_buffer=cfg.overlong.buffer,
                               overlong_factor=cfg.overlong.penalty, outcome=self.outcome, key=key)

    def _greedy_scores(self, problems) -> torch.Tensor:
        """``[P]`` reward of one greedy completion per prompt (for estimators that need it, ReMax),
        scored exactly as the sampled ones (their own stream of a random outcome's draws)."""
        key = RewardKey(self.cfg.seed, self.data_pos, first_row=self.world.row_offset(len(problems)), stream=1)
        with full_weights(self.policy):  # entered by every rank, even one with no prompts
            if not problems:
                # cpu: no prompts on this rank: the greedy scores are host values
                return torch.zeros(0)
            greedy = SamplingParams(temperature=0.0, max_new_tokens=self.cfg.rollout.max_new_tokens)
            out = self.backend.generate([self.task.prompt(p, self.tok) for p in problems], 1, greedy)
        return self._score(out, problems, 1, key).rewards
