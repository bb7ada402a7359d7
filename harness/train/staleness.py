"""Stale rollouts (``rollout.staleness=k``): the behaviour policy lags the trained one by ``k`` updates.

Large RL trainers generate with weights one or more steps old while they train (verl's
``one_step_off_policy``, AReaL's ``max_head_offpolicyness``, prime-rl's ``max_async_level``, TRL's
``max_staleness``). This module makes that lag an exact, sequential ablation: the rollouts used
at step ``t`` (1-based) are sampled with the policy's weights after update ``max(0, t - 1 - k)``
(version ``v`` = the weights after ``v`` optimizer steps; version 0 = the initial weights). So
the first ``k + 1`` steps all sample from the initial weights: their lag grows 0, 1, ..., k, and
from step ``k + 1`` on every step samples from weights exactly ``k`` updates old. ``k = 0`` is
the on-policy run (no copy is made; the trainer does not build this object).

:class:`LaggedPolicy` holds the behaviour module (a copy of the policy loaded with the lagged
version; the rollout backend generates with it: the ``hf`` backend uses the module, ``vllm``
receives its weights through its ``reload_weights`` path) and the ``k`` newer versions still to
come, as CPU state-dict copies (the model's size each: 0.5 GB for a 135M model in fp32). The
trainer also scores the batch under the behaviour module (the behaviour log-probs,
:mod:`harness.algo.offpolicy`), and a checkpoint holds every version a resume still needs.
"""

from __future__ import annotations

import copy

import torch


def _cpu_copy(state: dict) -> dict:
    """A detached CPU copy of a state dict (the live tensors move on after the next update)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}


class LaggedPolicy:
    """The behaviour policy of a stale run and the weight versions it still has to go through.

    Args:
        policy: the trained policy at version 0 (the initial weights); copied.
        staleness: ``k`` >= 1, the lag in updates (``rollout.staleness``).

    Attributes:
        module: the behaviour policy (eval mode, no gradients), holding :attr:`version`.
        version: the number of updates the behaviour weights have seen.
        pending: ``[(version, state dict)]``, the newer versions, oldest first (at most ``k``).
    """

    def __init__(self, policy: torch.nn.Module, staleness: int):
        if staleness < 1:
            raise ValueError(f"rollout.staleness={staleness}: a lagged policy needs staleness >= 1")
        self.k = int(staleness)
        self.module = copy.deepcopy(policy).eval().requires_grad_(False)
        self.version = 0
        self.pending: list[tuple[int, dict]] = []

    def advance(self, policy: torch.nn.Module, version: int) -> torch.nn.Module:
        """Record ``policy``'s weights as ``version`` (called after each update) and load the version
        the next step samples from, ``max(0, version - k)``, into :attr:`module`. Returns the module."""
        self.pending.append((int(version), _cpu_copy(policy.state_dict())))
        target = max(0, int(version) - self.k)
        while self.pending and self.pending[0][0] <= target:
            v, state = self.pending.pop(0)
            with torch.no_grad():
                self.module.load_state_dict(state)
            self.version = v
        return self.module

    def upcoming(self, policy_version: int) -> tuple[int, dict]:
        """The version the step after the current one samples from, and its weights, while the
        current step (the policy at ``policy_version``, before its update) has not trained yet:
        ``max(0, policy_version + 1 - k)``, which with ``k >= 1`` is at most ``policy_version``, so it
        exists already (the behaviour module's own, or a pending one). Used by ``rollout.overlap``
        (:mod:`harness.train.overlap`) to start that step's generation early; nothing is changed here.

        Returns:
            (version, state dict): the state dict is :attr:`module`'s own tensors or a pending copy;
            the caller copies it before the next :meth:`advance`.
        Raises:
            RuntimeError: the version is neither the behaviour module's nor pending (not reached
                when :meth:`advance` was called after every update).
        """
        target = max(0, int(policy_version) + 1 - self.k)
        if target == self.version:
            return target, self.module.state_dict()
        for v, state in self.pending:
            if v == target:
                return v, state
        raise RuntimeError(f"weight version {target} is not held (behaviour version {self.version}, pending "
                           f"{[v for v, _ in self.pending]})")

    def lag(self, policy_version: int) -> int:
        """Updates between the behaviour weights and the policy at ``policy_version``."""
        return int(policy_version) - self.version

    def state_dict(self, policy_version: int) -> dict:
        """What a resume needs: the behaviour weights and the pending versions, except the newest
        when it is ``policy_version`` (the checkpoint's policy weights are that one)."""
        pending = [(v, s) for v, s in self.pending if v != policy_version]
        return {"staleness": self.k, "version": self.version, "module": _cpu_copy(self.module.state_dict()),
                "pending": pending, "policy_version": int(policy_version)}

    def load_state_dict(self, state: dict, policy: torch.nn.Module) -> None:
        """Restore :meth:`state_dict`'s versions (``policy``: the resumed policy, the newest one).

        Raises:
            ValueError: the checkpoint was written with another ``rollout.staleness``.
        """
        if state["staleness"] != self.k:
            raise ValueError(f"rollout.staleness={self.k}, but the checkpoint was written with "
                             f"rollout.staleness={state['staleness']}")
        with torch.no_grad():
            self.module.load_state_dict(state["module"])
        self.version = state["version"]
        self.pending = list(state["pending"])
        if state["policy_version"] > self.version and all(v != state["policy_version"] for v, _ in self.pending):
            self.pending.append((state["policy_version"], _cpu_copy(policy.state_dict())))


__all__ = ["LaggedPolicy"]
