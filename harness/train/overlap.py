"""Overlapped stale rollouts (``rollout.overlap=true``): step ``t + 1``'s batch is generated while
step ``t`` trains.

With ``rollout.staleness=k >= 1`` (:mod:`harness.train.staleness`) the rollouts of step ``t + 1`` are
sampled with the weights after update ``max(0, t - k)``, which exist before step ``t``'s update
(``t - k <= t - 1``). So once step ``t`` has its batch, the next step's whole collection (prompts,
generation, rewards, the group filter's extra rounds) depends on nothing step ``t`` computes, and
can run beside it: verl's ``one_step_off_policy``, prime-rl's ``max_async_level``, AReaL's
asynchronous rollout. This module runs it in **one background thread** (a
``concurrent.futures`` executor with one worker and at most one future in flight, never a queue
of our own):

* before the submission, on the trainer's thread, the worker's own generation module (a copy of
  the policy, apart from the behaviour module the trainer scores step ``t`` with) is loaded with
  the version step ``t + 1`` samples from (:meth:`harness.train.staleness.LaggedPolicy.upcoming`), so
  step ``t``'s update cannot race it;
* the worker loads that module into the backend (``sync_weights``: the ``hf`` backend generates
  with it, ``vllm`` receives it through ``reload_weights``) and runs the trainer's collection from
  the data position step ``t + 1`` starts at, with the sampling seeds of that position;
* the trainer takes the result at the start of step ``t + 1``; the seconds it waited are
  ``time/rollout_wait_s``.

The batch is the one the sequential run (``overlap=false``) samples at step ``t + 1``: the same
weights, prompts and per-row seeds, and generation touches no global RNG. Torch releases the GIL
inside its ops, so the thread overlaps on a CPU too; on a GPU the engine's work is issued from the
worker while the update's is issued from the trainer's thread (one GPU in this colocated mode:
``benchmarks/gpu_train.py`` measures how much they overlap). Why a thread and not a process: the engine and the generation module stay in this
process, no weights cross a process boundary beyond what ``sync_weights`` already sends, and the
checkpoint, the RNG and the data position stay on the trainer's thread (the worker returns the
position it reached; it changes none of the trainer's state).

The backend is the worker's while a generation is in flight: the trainer waits for it
(:meth:`OverlappedRollout.wait`) before it uses the backend itself (evaluation).
"""

from __future__ import annotations

import concurrent.futures
import copy
import time
from typing import Callable, Optional

import torch

from harness.train.staleness import LaggedPolicy


class OverlappedRollout:
    """The background generation of the next step's batch.

    Args:
        lagged: the run's :class:`harness.train.staleness.LaggedPolicy` (``k >= 1``).
        backend: the rollout backend; the worker syncs the generation module into it before it
            generates.
        threads: torch's intra-op thread count for the worker (``torch.set_num_threads`` is
            per-thread: the worker computes with the trainer's count).

    Attributes:
        module: the generation weights (eval mode, no gradients).
        version: the weight version :attr:`module` holds (None before the first submission).
    """

    def __init__(self, lagged: LaggedPolicy, backend, threads: int):
        self.lagged, self.backend = lagged, backend
        self.module = copy.deepcopy(lagged.module).eval().requires_grad_(False)
        self.version: Optional[int] = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="rollout-overlap", initializer=torch.set_num_threads, initargs=(threads,))
        self._future: Optional[concurrent.futures.Future] = None
        self._start: Optional[int] = None

    @property
    def pending(self) -> bool:
        """Whether a submitted batch has not been taken yet."""
        return self._future is not None

    def submit(self, collect: Callable[[int], tuple], data_pos: int, policy_version: int) -> None:
        """Start the next step's collection: ``collect(data_pos)`` in the worker, with the weights
        the next step samples from (the policy is at ``policy_version``, before this step's update).

        Raises:
            RuntimeError: a batch is still pending (one in flight at most).
        """
        if self._future is not None:
            raise RuntimeError("rollout.overlap: the previous batch has not been taken")
        version, state = self.lagged.upcoming(policy_version)
        if version != self.version:
            with torch.no_grad():
                self.module.load_state_dict(state)
            self.version = version
        self._start = int(data_pos)
        self._future = self._pool.submit(self._run, collect, int(data_pos))

    def _run(self, collect: Callable[[int], tuple], data_pos: int) -> tuple:
        self.backend.sync_weights(self.module)
        return collect(data_pos)

    def take(self, data_pos: int) -> tuple[int, tuple, float]:
        """The pending batch, for the step starting at ``data_pos``.

        Returns:
            (the weight version it was sampled with, what ``collect`` returned, the seconds this
            call waited for it).
        Raises:
            RuntimeError: nothing is pending, or it was started at another data position.
            Whatever ``collect`` raised in the worker.
        """
        if self._future is None or self._start != data_pos:
            raise RuntimeError(f"rollout.overlap: no batch pending for data position {data_pos} "
                               f"(pending: {self._start if self._future is not None else None})")
        t0 = time.perf_counter()
        future, self._future = self._future, None
        return self.version, future.result(), time.perf_counter() - t0

    def wait(self) -> None:
        """Block until the worker is idle (the backend is free); the batch stays pending."""
        if self._future is not None:
            concurrent.futures.wait([self._future])

    def close(self) -> None:
        """Drop a pending batch and stop the worker (after the generation in flight, if any)."""
        if self._future is not None:
            self._future.cancel()
            self._future = None
        self._pool.shutdown(wait=True)


__all__ = ["OverlappedRollout"]
