"""The training loop. One step reads as the data path::

    prompts -> rollout -> rewards -> advantages -> per-token loss -> aggregate -> update -> log
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from harness import progress
from harness.algo import AdvantageContext, Algorithm, build_algorithm, mismatch_stats
from harness.model.lora import build_adapters, trainable_fraction, trainable_parameters
from harness.model.precision import compute_dtype
from harness.rollout import RolloutBatch
from harness.runtime.health import HealthMonitor
from harness.runtime.perf import PeakMemory
from harness.train import distributed, eval_cache
from harness.train.collect import CollectMixin
from harness.train.distributed import full_weights, world
from harness.train.evaluation import BY_OUTCOME, completion_len_by_outcome, evaluate
from harness.train.overlap import OverlappedRollout
from harness.train.rewards import RewardOutput, outcome_reward, process_step_rewards, shape_rewards
from harness.train.staleness import LaggedPolicy
from harness.train.step_metrics import StepOutputs, step_metrics
from harness.train.trainer_checkpoint import CheckpointMixin
from harness.train.update import TrainBatch, batched_logprobs, padding_waste, policy_pass

log = logging.getLogger(__name__)


class TrainingStopped(RuntimeError):
    """Too many consecutive non-finite steps; a checkpoint was saved before raising."""


@dataclass
class StepRecord:
    """What one training step computed, passed to ``on_step`` (tests, notebooks, custom logging).

    Attributes:
        step: the step number (1-based, as logged).
        batch: the rollout batch (rows group-major).
        rewards: the reward components, ``[B]`` each.
        scores: ``[P, G]`` sequence scores the estimator saw (rewards minus reward-placed KL).
        advantages: ``[B, T]``; returns: ``[B, T]`` value targets or None.
        loss_mask: ``[B, T]`` the tokens the loss used.
        metrics: the step's logged metrics (evals included when the step evaluated).
        greedy_scores: ``[P]`` greedy-completion rewards, for estimators that need them (ReMax).
        logprobs: ``[B, T]`` the policy's log-probs in the step's first optimisation pass.
    """

    step: int
    batch: RolloutBatch
    rewards: RewardOutput
    scores: torch.Tensor
    advantages: torch.Tensor
    returns: Optional[torch.Tensor]
    loss_mask: torch.Tensor
    metrics: dict
    greedy_scores: Optional[torch.Tensor] = None
    logprobs: Optional[torch.Tensor] = None


def lr_lambda(schedule: str, warmup: int, total: int):
    """Multiplier of the base lr at update ``i`` (linear warm-up, then constant/linear/cosine)."""

    def fn(i: int) -> float:
        if warmup and i < warmup:
            return (i + 1) / warmup
        frac = (i - warmup) / max(1, total - warmup)
        return {"constant": 1.0, "linear": 1.0 - frac, "cosine": 0.5 * (1 + math.cos(math.pi * frac))}[schedule]

    return fn


class Trainer(CollectMixin, CheckpointMixin):
    """Owns the models, optimizers and loop state of one run.

    Args:
        cfg: the resolved :class:`harness.launch.config.Config` (OmegaConf object).
        task, tokenizer, policy, backend, tracker: built by :mod:`harness.run`.
        critic: a :class:`harness.train.critic.Critic` when the estimator needs values, else None.
        checkpoint_dir: where checkpoints go.
        on_eval: optional ``fn(step, metrics)`` called after each evaluation.
        on_step: optional ``fn(record: StepRecord)`` called after each step's metrics are complete.
        config_key: the run's :func:`harness.launch.job.config_key`, stored in each checkpoint.
        algorithm: the run's :class:`harness.algo.Algorithm` (built from ``cfg`` when None).

    The algorithm (estimator, policy loss, aggregation, KL, rollout correction, group filter) is
    built once; what the estimator declares in ``needs`` (critic values, step rewards, a greedy
    completion) is computed for it. No variant is named here.

    Under ``torchrun`` (:mod:`harness.train.distributed`) each rank samples its share of the step's
    prompts; the estimator, the loss normalisers, the gradient and the metrics are those of the
    global batch, so a step equals the one-process step on the same prompts. Only rank 0 has a
    real ``tracker`` and writes checkpoints (holding every rank's RNG state).

    Collecting the step's batch (:class:`harness.train.collect.CollectMixin`) and the checkpoint
    (:class:`harness.train.trainer_checkpoint.CheckpointMixin`) are methods of this class kept in
    their own modules.
    """

    def __init__(self, cfg, task, tokenizer, policy, backend, tracker, critic=None, checkpoint_dir=None,
                 on_eval=None, on_step=None, config_key=None, algorithm: Optional[Algorithm] = None):
        self.cfg, self.task, self.tok, self.policy = cfg, task, tokenizer, policy
        self.algo = algorithm if algorithm is not None else build_algorithm(cfg)
        self.outcome = outcome_reward(cfg.reward)  # reward=: the outcome component of every completion's reward
        self.config_key = config_key  # written into checkpoints: another config's job must not resume them
        self.on_eval, self.on_step = on_eval, on_step
        self.world = world()
        progress.configure(cfg.rollout.progress and self.world.is_main)  # the one switch; rank 0 reports
        self.world.broadcast_module(policy)  # every rank starts from rank 0's weights
        if critic is not None:
            self.world.broadcast_module(critic.model)
        self.kl_coef = float(self.algo.kl.beta)  # the KL coefficient of the next step (kl.controller moves it)
        # the entropy bonus's coefficient (entropy_control moves it) and the last step's entropy
        self.entropy_coef, self.last_entropy = float(self.algo.entropy_coef), math.inf
        if self.algo.needs("values") and critic is None:
            raise ValueError(f"advantage={self.algo.estimator.name} needs critic values: pass critic=...")
        if cfg.eval.initial_cache and self.world.distributed:  # the cache holds one process's whole eval
            raise ValueError(f"eval.initial_cache={cfg.eval.initial_cache!r}: expected a one-process run "
                             f"(world size {self.world.world_size}); set eval.initial_cache=null under torchrun")
        self.backend, self.tracker, self.critic = backend, tracker, critic
        # rollout.staleness=k: the backend samples with the weights of k updates ago (harness.train.staleness)
        self.lagged = LaggedPolicy(policy, cfg.rollout.staleness) if cfg.rollout.staleness else None
        if self.lagged is not None:
            backend.sync_weights(self.lagged.module)
        # rollout.overlap: the next step's batch is generated in a background thread (harness.train.overlap)
        self.overlap = OverlappedRollout(self.lagged, backend, torch.get_num_threads()) if cfg.rollout.overlap else None
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        t = cfg.train
        # lora=none: the whole policy trains and the reference is a frozen copy; lora=peft: only the
        # adapters train and the reference is the policy itself, run with its adapters off
        self.adapters = build_adapters(cfg.get("lora"))
        self.ref = self.adapters.reference(policy) if self.algo.kl.uses_ref else None
        if t.sharding == "fsdp2":  # before the optimizer: it must hold the shards
            distributed.shard(policy)
            if self.ref is not None:
                distributed.shard(self.ref)
        # the share of the policy's parameters this rank holds (1.0 unless sharded): perf/param_shard_frac
        self.param_frac = distributed.local_fraction(policy.parameters())
        self.trainable_frac = trainable_fraction(policy)  # perf/trainable_param_frac
        self.opt = torch.optim.AdamW(trainable_parameters(policy), lr=t.lr, betas=tuple(t.adam_betas),
                                     weight_decay=t.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lr_lambda(t.lr_schedule, t.warmup_steps, t.steps))
        self.adv_state: dict = {}
        self.step = 0
        self.data_pos = 0
        self.bad_steps = 0
        self.skipped = 0
        self.start_time = time.time()
        self.elapsed_before = 0.0
        self.health = HealthMonitor()
        self._last: Optional[StepRecord] = None






    # ---------------------------------------------------------------------- step
    def _length_shaped(self, rewards, cmask, prompt_mask):
        """``rewards`` ``[B]`` (this rank's rows) after ``length_penalty=``, applied per group of the
        global batch: the output tokens are each completion's (up to and including EOS), the input
        tokens its prompt's, one turn each. The same tensor object when the penalty is the identity
        (``none``)."""
        G, w = self.cfg.group_size, self.world
        per_group = [w.gather_rows(x).to(torch.float64).view(-1, G) for x in (rewards, cmask.sum(1), prompt_mask.sum(1))]
        shaped = self.algo.length_penalty(*per_group, torch.ones_like(per_group[0]))
        if shaped is per_group[0]:
            return rewards
        first = w.row_offset(rewards.shape[0])
        return shaped.reshape(-1)[first : first + rewards.shape[0]].to(rewards.dtype)

    @property
    def step_entropy_coef(self) -> float:
        """The entropy bonus's coefficient this step applies: the controller's (``entropy_coef``,
        moved by ``entropy_control``), or 0 while the controller holds the bonus off
        (``train/entropy_bonus_applied`` = 0)."""
        return self.entropy_coef if self.algo.entropy_control.params.applies(self.last_entropy) else 0.0

    def train_step(self) -> dict:
        """One step, read as the data path: rollout -> log-probs -> rewards (length shaping, KL
        placed in the reward) -> advantages (the estimator on the global batch) -> ``mu`` updates
        -> weight sync -> metrics -> the KL and entropy controllers. Returns the step's metrics."""
        t_start = time.perf_counter()
        with progress.phase("rollout"):
            batch, rew, problems, info = self._next_batch()
        old, behaviour, ref, values, times = self._logprob_passes(batch)
        rewards = self._length_shaped(rew.rewards, batch.completion_mask, batch.prompt_mask)
        scores, token_rewards = shape_rewards(rewards, batch.loss_mask, old, ref, self.algo.kl, beta=self.kl_coef)
        with progress.phase("greedy rollout"):
            greedy = self._greedy_scores(problems) if self.algo.needs("greedy") else None
        ctx = self._advantage_context(batch, rew, rewards, scores, token_rewards, values, greedy)
        adv = self.algo.estimator(ctx)  # float64; tool observations packed out
        adv = dataclasses.replace(adv, advantages=self.algo.advantage_transform(adv.advantages))  # advantage_transform=
        # each rank trains on its own rows of the global advantages
        first, n, width = self.world.row_offset(batch.num_sequences), batch.num_sequences, batch.completion_mask.shape[1]
        local_adv = adv.advantages[first : first + n, :width]
        local_returns = adv.returns[first : first + n, :width] if adv.returns is not None else None
        loss_mask = self._loss_mask(batch)
        tb = TrainBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, loss_mask,
                        local_adv, old, ref, values, local_returns, sampler_logprobs=batch.sampler_logprobs,
                        attention_mask=None if batch.observation_mask is None else batch.completion_mask)
        lr = self.sched.get_last_lr()[0]  # the learning rate this step's update uses
        with progress.phase("update"), _timed(times, "time/update_s"):
            stats = self._update(tb)
        self.step += 1
        self._refresh_reference()
        with _timed(times, "time/weight_sync_s"):  # into the rollout engine (vLLM); the hf backend shares the module
            sampler = self.policy if self.lagged is None else self.lagged.advance(self.policy, self.step)  # stale: lagged
            if self.overlap is None:  # overlapped: the worker syncs the next generation's weights itself
                self.backend.sync_weights(sampler)
        times["time/step_s"] = time.perf_counter() - t_start
        metrics = step_metrics(StepOutputs(
            batch, rew, rewards, ctx.mask, adv.advantages, info, stats, self._controls(lr), times,
            elapsed_s=self.elapsed_before + time.time() - self.start_time, padding_waste=self._padding_waste(batch),
            param_frac=self.param_frac, mismatch=self._mismatch_stats(batch, old if behaviour is None else behaviour,
                                                                      loss_mask)), self.world)
        metrics["perf/trainable_param_frac"] = self.trainable_frac  # 1.0 full fine-tuning; lora=peft: the adapters'
        self._move_controllers(metrics, n_samples=ctx.mask.shape[0])
        G = self.cfg.group_size
        self._last = StepRecord(self.step, batch, rew, ctx.scores[first // G : (first + n) // G], local_adv,
                                local_returns, loss_mask, metrics, greedy, self._first_logprobs)
        return metrics

    def _loss_mask(self, batch: RolloutBatch) -> torch.Tensor:
        """``[b, T]`` the tokens the loss uses: the model's completion tokens (tool observations
        excluded, :attr:`RolloutBatch.loss_mask`), without the truncated completions' under
        ``overlong.mask_truncated``."""
        loss_mask = batch.loss_mask.clone()
        if self.cfg.overlong.mask_truncated:
            loss_mask[batch.truncated] = 0
        return loss_mask

    def _logprob_passes(self, batch: RolloutBatch):
        """The forward passes before the update, each run only when the algorithm needs it: the
        policy's old log-probs, the behaviour policy's (a stale run's, :mod:`harness.train.staleness`),
        the reference's log-probs, the critic's values (``[b, T]`` each, else None), and their times
        (seconds: ``time/logprob_s`` all, then each).

        The old log-probs are the ratio's denominator (``offpolicy=``): the proximal policy's (the
        current weights, before the update) when the objective declares so, else the behaviour
        policy's, which on-policy are the same weights; a stale run's behaviour log-probs are always
        computed (the mismatch metrics compare them with the sampler's)."""
        fwd, args = self.algo.forward, (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
        kw = dict(temperature=fwd.temperature, chunk=fwd.chunk, micro_batch_size=self.cfg.train.micro_batch_size,
                  share_prefix=fwd.share_prefix, precision=fwd.precision, keep=fwd.keep)
        t0 = time.perf_counter()
        behaviour_is_old = self.lagged is not None and not self.algo.ratio_against_proximal
        with full_weights(self.policy), progress.phase("old log-probs"):
            need_old = self.algo.needs_old_logprobs and not behaviour_is_old
            old = batched_logprobs(self.policy, *args, **kw) if need_old else None
            # the behaviour policy's forward is timed with the old one's (time/old_logprob_s)
            behaviour = batched_logprobs(self.lagged.module, *args, **kw) if self.lagged is not None else None
        if behaviour_is_old:
            old = behaviour
        t_old = time.perf_counter() - t0
        with full_weights(self.ref), self.adapters.reference_mode(self.ref), progress.phase("reference log-probs"):
            ref = batched_logprobs(self.ref, *args, **kw) if self.ref is not None else None
        t_ref = time.perf_counter() - t0 - t_old
        with progress.phase("critic values"):
            values = self.critic.values(*args, self.cfg.train.micro_batch_size) if self.critic is not None else None
        t_all = time.perf_counter() - t0
        return old, behaviour, ref, values, {"time/logprob_s": t_all, "time/old_logprob_s": t_old,
                                             "time/ref_logprob_s": t_ref, "time/value_s": t_all - t_old - t_ref}

    def _advantage_context(self, batch, rew, rewards, scores, token_rewards, values, greedy) -> AdvantageContext:
        """The estimator's input over the global batch (all ranks' rows, rank order): the scores
        ``[P, G]``, token rewards and mask ``[N, T]``, and what the estimator declares it needs
        (critic values, step rewards, the greedy scores, the reward's components)."""
        algo, w, G, cmask = self.algo, self.world, self.cfg.group_size, batch.loss_mask
        steps = None
        if algo.needs("step_rewards"):
            steps = process_step_rewards(self.task, self.tok, batch.texts, batch.completion_ids, cmask, rewards)
        gmask = w.gather_rows(cmask)
        if w.distributed and steps is not None:
            steps = [r for part in w.gather_objects(steps) for r in part]
        comps = weights = None
        if algo.needs("reward_components"):  # the summed reward's parts, each with its weight in the sum
            parts = (rew.outcome, rew.formatted, rew.overlong, scores - rew.rewards)  # the last: length, KL shaping
            comps = torch.stack([w.gather_rows(x.to(scores.dtype)) for x in parts], dim=-1).view(-1, G, len(parts))
            weights = torch.tensor([1.0, float(self.cfg.task.format_reward), 1.0, 1.0], dtype=scores.dtype,
                                   device=scores.device)
        return AdvantageContext(scores=w.gather_rows(scores).view(-1, G), token_rewards=w.gather_rows(token_rewards),
                                mask=gmask, values=w.gather_rows(values), step_rewards=steps, state=self.adv_state,
                                greedy_scores=w.gather_rows(greedy), reward_components=comps, reward_weights=weights)

    def _refresh_reference(self) -> None:
        """Copy the policy into the reference every ``kl.ref_refresh_steps`` steps (0: never)."""
        refresh = self.algo.kl.ref_refresh_steps
        if self.ref is not None and refresh and self.step % refresh == 0:
            self.ref.load_state_dict(self.policy.state_dict())  # sharded: shard to shard, same layout

    # ------------------------------------------------------------------- metrics
    def _controls(self, lr: float) -> dict:
        """The trainer's own scalars of this step, logged as they are."""
        return {"train/lr": lr, "train/kl_coef": self.kl_coef,
                "train/entropy_coef": self.entropy_coef,  # the controller's coefficient, as TRL logs it
                "train/entropy_bonus_applied": float(self.step_entropy_coef == self.entropy_coef),
                "train/skipped_updates": float(self.skipped)}

    def _padding_waste(self, batch: RolloutBatch) -> float:
        """This rank's :func:`harness.train.update.padding_waste` of the training forwards."""
        prompt_ids = batch.prompt_ids if self.algo.forward.share_prefix else None
        return padding_waste(batch.prompt_mask, batch.completion_mask, self.cfg.train.micro_batch_size, prompt_ids)

    def _mismatch_stats(self, batch, old, loss_mask) -> Optional[dict]:
        """This rank's :func:`harness.algo.mismatch_stats`: the sampler's log-probs against the
        trainer's under the same weights (``old`` when computed, else the first update pass's), over
        its loss tokens; no tokens when the backend reports none; None (not measured) when the
        forward temperature is 0."""
        if self.algo.forward.temperature <= 0:
            return None
        if batch.sampler_logprobs is None:
            # cpu: no rows: empty host tensors
            return mismatch_stats(torch.zeros(0, 1), torch.zeros(0, 1), torch.zeros(0, 1), 1.0)
        trainer = old if old is not None else self._first_logprobs
        return mismatch_stats(trainer, batch.sampler_logprobs, loss_mask, self.algo.rollout_correction.params.cap)

    def _move_controllers(self, metrics: dict, n_samples: int) -> None:
        """The KL controller sets the next step's coefficient from this step's ``train/kl`` (over
        ``n_samples``, the step's completions over all ranks, as one process has them), the
        entropy controller the next step's bonus from ``train/entropy``."""
        if "train/kl" in metrics:
            self.kl_coef = self.algo.kl.next_beta(self.kl_coef, metrics["train/kl"], n_samples)
        if "train/entropy" in metrics:
            self.entropy_coef = self.algo.entropy_control(self.entropy_coef, metrics["train/entropy"])
            self.last_entropy = metrics["train/entropy"]

    def _update(self, tb: TrainBatch) -> dict:
        """``mu`` optimizer steps on ``tb``; the statistics (logged as ``train/<name>``) are means
        over the passes, except ``entropy``: the first pass's, i.e. the mean per-token entropy
        (nats) of the sampling distribution (the policy before this step's updates, logits divided
        by ``rollout.temperature``, renormalised over the ``rollout.top_k`` / ``top_p`` keep set) over the loss tokens,
        token-weighted over micro-batches and ranks (:func:`harness.train.update.policy_pass`)."""
        cfg, mb, mu = self.cfg, self.cfg.train.micro_batch_size, self.algo.mu
        stats: dict = {}
        warmup = self.critic is not None and self.critic.in_warmup(self.step)
        # cpu: StepRecord.logprobs stays with the CPU batch (tb)
        self._first_logprobs = torch.zeros(tb.loss_mask.shape, dtype=compute_dtype(self.policy))
        for i in range(mu):  # statistics are averaged over the mu passes
            if self.critic is not None:
                _accumulate(stats, self.critic.update(tb, mb), mu)
            if warmup:
                continue
            self.opt.zero_grad(set_to_none=True)
            s = policy_pass(self.policy, tb, self.algo, mb, beta=self.kl_coef, entropy_coef=self.step_entropy_coef,
                            logprobs_out=self._first_logprobs if i == 0 else None)
            s["grad_norm"] = distributed.clip_grad_norm_(self.policy.parameters(), cfg.train.max_grad_norm)
            if not (math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"])):
                self._bad_step()
                return stats | s
            self.bad_steps = 0
            self.opt.step()
            if i == 0 and "entropy" in s:
                first_entropy = s["entropy"]
            _accumulate(stats, s, mu)
        if "entropy" in stats:
            stats["entropy"] = first_entropy
        if not warmup:
            self.sched.step()
        return stats

    def _bad_step(self) -> None:
        """Skip a non-finite update; stop (after a checkpoint) when too many come in a row."""
        self.opt.zero_grad(set_to_none=True)
        self.skipped += 1
        self.bad_steps += 1
        log.warning("non-finite loss/grad at step %d: update skipped (%d in a row)", self.step + 1, self.bad_steps)
        if self.bad_steps >= self.cfg.train.max_bad_steps:
            self.save_checkpoint()
            raise TrainingStopped(
                f"{self.bad_steps} consecutive non-finite steps (train.max_bad_steps="
                f"{self.cfg.train.max_bad_steps}); checkpoint saved in {self.checkpoint_dir}")

    # -------------------------------------------------------------------- loop
    def run_eval(self, step: int) -> dict:
        """Evaluate on the fixed eval set; data-parallel, each rank scores a contiguous share and the
        per-problem means are combined (weighted by share size), the sample table is rank 0's."""
        cfg, w = self.cfg, self.world
        problems = self.task.eval[: cfg.eval.size] if cfg.eval.size else self.task.eval
        share = w.shard(len(problems))
        seed = cfg.seed * 1_000_003 + 999_983 * (step + 1)
        t0 = time.perf_counter()
        cached, key = None, None
        if step == 0 and cfg.eval.initial_cache:  # validated single-process (harness.launch.validate)
            prompts = [self.task.prompt(p, self.tok) for p in problems]
            key = eval_cache.initial_eval_key(cfg, self.policy, prompts, problems, seed)
            cached = eval_cache.load(cfg.eval.initial_cache, key)
        if cached is not None:
            m, rows, correct, lengths = cached["metrics"], cached["rows"], cached["correct"], cached["lengths"]
            log.info("step-0 eval replayed from %s (key %s...)", cfg.eval.initial_cache, key[:12])
        else:
            correct, lengths = [], []
            with full_weights(self.policy), progress.phase("eval"), self._policy_in_backend():
                m, rows = evaluate(self.task, self.backend, self.tok, problems[share.start : share.stop],
                               max_new_tokens=cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens,
                               num_samples=cfg.eval.num_samples, temperature=cfg.eval.temperature,
                               batch_size=cfg.eval.batch_size, log_samples=cfg.eval.log_samples,
                               seed=seed, first_index=share.start, correct_out=correct, lengths_out=lengths)
            if key is not None:
                eval_cache.store(cfg.eval.initial_cache, key,
                                 {"metrics": m, "rows": rows, "correct": correct, "lengths": lengths})
        if step == 0 and key is not None and w.is_main:
            self.tracker.set_tags({"eval.initial_cached": str(cached is not None).lower()})
        correct = [c for part in w.gather_objects(correct) for c in part]  # eval-set order
        if w.is_main:  # per-problem greedy verdicts: intervals over problems (analysis.ablation)
            self.tracker.log_text(json.dumps({"step": step, "problem_ids": [p.id for p in problems],
                                              "correct": correct}), f"eval/correct_step_{step:06d}.json")
        if w.distributed:
            n = max(len(problems), 1)
            # means over outcomes are not share-weighted: recomputed from the gathered lengths
            lengths = [x for part in w.gather_objects(lengths) for x in part]
            m = {k: v for k, v in m.items() if k.removeprefix("eval/") not in BY_OUTCOME}
            summed = w.sum_dict({k: v * len(share) for k, v in m.items() if k != "eval/num_samples"})
            m = {**m, **{k: v / n for k, v in summed.items()}, **completion_len_by_outcome(lengths, correct, "eval")}
        if rows and w.is_main:
            self.tracker.log_table(rows, f"samples/eval_step_{step:06d}.json")
        m = {**m, "time/eval_s": time.perf_counter() - t0}  # this process's eval, replayed or generated
        if self.on_eval is not None:
            self.on_eval(step, m)
        return m

    @contextmanager
    def _policy_in_backend(self):
        """Evaluation measures the trained policy: a stale run's backend holds the behaviour weights,
        so the policy's go in for the ``with`` block and the behaviour's back after it."""
        if self.lagged is None:
            yield
            return
        if self.overlap is not None:  # the backend is the worker's until its generation is done
            self.overlap.wait()
        self.backend.sync_weights(self.policy)
        try:
            yield
        finally:
            self.backend.sync_weights(self.lagged.module)

    def fit(self) -> dict:
        """Run ``train.steps`` steps with evals before, every ``eval.every`` steps and at the end.

        Metrics are flushed to MLflow when a checkpoint is written (or every step when
        checkpoints are off), so a resumed run never logs a step twice.
        """
        cfg = self.cfg
        history = {}
        peak, w = PeakMemory(), self.world
        say = log.info if w.is_main else log.debug  # metrics are global: rank 0 says them once
        if self.step == 0:
            progress.set_step(0, cfg.train.steps)
            t0 = time.perf_counter()
            history[0] = self.run_eval(0)
            self.tracker.log_metrics(history[0], step=0)
            say("step 0/%d %s", cfg.train.steps, _eval_line(history[0], time.perf_counter() - t0))
        while self.step < cfg.train.steps:
            peak.reset()
            progress.set_step(self.step + 1, cfg.train.steps)
            m = self.train_step()
            m["perf/peak_mem_gib"] = w.max(peak.read()) / 2**30  # the largest rank's
            step = self.step
            last = step == cfg.train.steps
            t_eval = None
            if (cfg.eval.every and step % cfg.eval.every == 0) or last:
                t0 = time.perf_counter()
                m.update(self.run_eval(step))
                t_eval = time.perf_counter() - t0
            history[step] = m
            self.tracker.queue(m, step=step)
            self.tracker.heartbeat()
            for warning in self.health.check(step, m):  # metrics are global: rank 0 says it once
                (log.warning if w.is_main else log.debug)("%s", warning.message)
                self.tracker.set_tags({warning.tag: warning.message})
            if self.on_step is not None:
                self.on_step(self._last)
            say("step %d/%d reward %.3f acc %.3f %s| %s", step, cfg.train.steps, m["train/reward_mean"],
                m["train/accuracy"], f"{_eval_line(m)} " if t_eval is not None else "", _phase_split(m, t_eval))
            periodic = self.checkpoint_dir is not None and cfg.checkpoint.every > 0
            due = periodic and step % cfg.checkpoint.every == 0
            if due or last:  # the checkpoint holds the unflushed metrics: see load_state_dict
                self.save_checkpoint(finished=last)
            if due or last or not periodic:
                self.tracker.flush()
        if self.overlap is not None:
            self.overlap.close()
        return history







def _eval_line(m: dict, seconds: float | None = None) -> str:
    """``eval_acc 0.250 format 0.750`` (and the eval's time) for the step lines."""
    took = f" ({seconds:.1f} s)" if seconds is not None else ""
    return f"eval_acc {m.get('eval/accuracy', float('nan')):.3f} format {m.get('eval/format_rate', float('nan')):.3f}{took}"


TIMED_METRICS = ("time/", "system/", "perf/tokens_per_s", "perf/peak_mem", "perf/rollout_tgs", "perf/training_tgs",
                 "perf/effective_tgs", "perf/weight_sync_frac")
"""Prefixes of the metrics that measure time or memory: two runs of one config differ in these and
agree in every other metric (the rerun, resume and kill tests compare the rest)."""


SPLIT = (("rollout", "time/rollout_s"), ("reward", "time/reward_s"), ("log-probs", "time/logprob_s"),
         ("update", "time/update_s"))
"""The phases of a step's line and the ``time/*`` metric each is read from."""


def _phase_split(m: dict, t_eval: float | None) -> str:
    """``12.3 s: rollout 8.1, reward 0.1, log-probs 1.2, update 2.9[, eval 4.0]`` from the step's metrics."""
    parts = [f"{name} {m[key]:.1f}" for name, key in SPLIT if key in m]
    if t_eval is not None:
        parts.append(f"eval {t_eval:.1f}")
    return f"{m['time/step_s'] + (t_eval or 0.0):.1f} s: {', '.join(parts)}"


@contextmanager
def _timed(times: dict, key: str):
    """Set ``times[key]`` to the seconds the ``with`` block took."""
    t0 = time.perf_counter()
    yield
    times[key] = time.perf_counter() - t0


def _accumulate(total: dict, new: dict, n: int) -> None:
    for k, v in new.items():
        total[k] = total.get(k, 0.0) + v / n
