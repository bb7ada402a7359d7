"""A :class:`harness.train.trainer.Trainer`'s checkpoint: everything an exact resume needs (every
component's state, the RNG of each rank, the data position, the unsent metrics), written by rank 0
(:mod:`harness.train.checkpoint`), and loaded back."""

from __future__ import annotations

import shutil
import time

from mlflow.entities import Metric

from harness.train import checkpoint as ckpt
from harness.train import distributed


class CheckpointMixin:
    """The :class:`harness.train.trainer.Trainer` methods that save and load its state; they use the
    trainer's attributes (models, optimizer, scheduler, critic, controllers, tracker)."""

    def _model_states(self) -> dict:
        """Full policy / optimizer / reference state dicts (:func:`harness.train.distributed.full_state`: a
        collective when sharded, so every rank calls it)."""
        if distributed.is_sharded(self.policy):
            policy, opt = distributed.full_state(self.policy, self.opt)
        else:  # lora=peft: the adapters only
            policy, opt = self.adapters.trainable_state(self.policy), self.opt.state_dict()
        # the reference only differs from the loaded initial weights once it is refreshed
        ref = distributed.full_state(self.ref)[0] if self.ref is not None and self.algo.kl.ref_refresh_steps else None
        return {"policy": policy, "optimizer": opt, "ref": ref}

    def state_dict(self, models: dict | None = None) -> dict:
        """Everything a resume needs; ``models``: :meth:`_model_states` when already gathered."""
        return {
            "step": self.step, "data_pos": self.data_pos, "run_id": self.tracker.run_id,
            "config_key": self.config_key,
            **(models if models is not None else self._model_states()),
            "scheduler": self.sched.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "adv_state": self.adv_state, "rng": ckpt.rng_state(), "skipped": self.skipped, "kl_coef": self.kl_coef,
            "entropy_coef": self.entropy_coef, "last_entropy": self.last_entropy,
            "lagged": self.lagged.state_dict(self.step) if self.lagged is not None else None,
            "elapsed_s": self.elapsed_before + time.time() - self.start_time,
            "pending_metrics": [(m.key, m.value, m.timestamp, m.step) for m in self.tracker.pending],
        }

    def save_checkpoint(self, finished: bool = False):
        """Write a checkpoint (rank 0; every rank calls this at the same step: it gathers each rank's
        RNG state into ``rng_per_rank`` and waits until the file is in place).

        The final one (``finished``) is kept as ``checkpoint.keep_final`` says: ``full`` as any
        checkpoint (with ``checkpoint.keep`` of them); ``weights`` / ``merged`` write the policy to
        ``<checkpoint dir>/final/`` first (:meth:`harness.model.lora.FullFineTuning.save_final`: the model,
        or with LoRA peft's adapter folder / the merged model), then the finished marker (the
        checkpoint without model or optimizer state); ``none`` the marker only. Those three leave no
        other checkpoint.
        """
        if self.checkpoint_dir is None:
            return None
        keep_final = self.cfg.checkpoint.keep_final if finished else "full"
        rngs = self.world.gather_objects(ckpt.rng_state())
        models, gathered = None, None
        sharded = distributed.is_sharded(self.policy)
        if keep_final in ckpt.KEEP_FOLDER and sharded:  # a collective: every rank gathers
            gathered = distributed.full_state(self.policy)[0]
        elif keep_final == "full" and sharded:
            models = self._model_states()
        path = None
        if self.world.is_main:
            if keep_final != "full":
                models = {"policy": None, "optimizer": None, "ref": None}
            state = self.state_dict(models)
            state["finished"] = finished
            state["world_size"] = self.world.world_size
            if self.world.distributed:
                state["rng_per_rank"] = rngs
            if keep_final in ckpt.KEEP_FOLDER:
                base = "tiny-random" if self.cfg.model.tiny_config else self.cfg.model.name_or_path
                ckpt.save_final_weights(self.checkpoint_dir, lambda tmp: self.adapters.save_final(
                    tmp, self.policy, keep_final, gathered, base_name=base), self.tok)
            elif finished:  # none: no weights; full: they are in the checkpoint
                shutil.rmtree(self.checkpoint_dir / ckpt.FINAL_WEIGHTS, ignore_errors=True)
            if finished:
                state = ckpt.finished_marker(state, keep_final)
            keep = self.cfg.checkpoint.keep if keep_final == "full" else 1
            path = ckpt.save(self.checkpoint_dir, self.step, state, keep=keep)
        self.world.barrier()
        return path

    def load_state_dict(self, state: dict) -> None:
        self.step, self.data_pos = state["step"], state["data_pos"]
        if distributed.is_sharded(self.policy):
            distributed.load_full_state(self.policy, state["policy"], self.opt, state["optimizer"])
        else:  # lora=peft: the checkpoint holds the adapters only
            self.adapters.load_trainable_state(self.policy, state["policy"])
            self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        if self.ref is not None and state.get("ref") is not None:
            distributed.load_full_state(self.ref, state["ref"])
        if self.critic is not None and state.get("critic") is not None:
            self.critic.load_state_dict(state["critic"])
        self.adv_state.clear()
        self.adv_state.update(state.get("adv_state") or {})
        self.skipped = state.get("skipped", 0)
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        self.entropy_coef = state.get("entropy_coef", self.entropy_coef)
        self.last_entropy = state.get("last_entropy", self.last_entropy)
        self.elapsed_before = state.get("elapsed_s", 0.0)
        per_rank = state.get("rng_per_rank")
        same_world = per_rank is not None and len(per_rank) == self.world.world_size
        ckpt.set_rng_state(per_rank[self.world.rank] if same_world else state["rng"])
        if self.lagged is not None:
            self.lagged.load_state_dict(state["lagged"], self.policy)
        self.backend.sync_weights(self.policy if self.lagged is None else self.lagged.module)
        self._log_pending(state.get("pending_metrics") or [])

    def _log_pending(self, pending: list) -> None:
        """Send the metrics a checkpoint holds unless MLflow already has them (exactly once).

        A run killed between writing a checkpoint and flushing its metrics would otherwise
        miss those steps; one killed after the flush would log them twice on resume. The tracker
        drops every ``(key, step)`` the run already holds.
        """
        self.tracker.extend([Metric(k, v, ts, st) for k, v, ts, st in pending])
        self.tracker.flush()
