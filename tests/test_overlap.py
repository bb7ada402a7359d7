"""Overlapped stale rollouts (``rollout.overlap=true``, :mod:`harness.train.overlap`).

* overlap=true equals overlap=false at staleness 1 and 2 (and with DAPO's resampling filter, LoRA,
  a tool's episodes), same seeds, float64 tiny model: every step's rollouts exactly, every logged metric, the final weights
  to 1e-10;
* the next step's generation really runs in the worker thread while the current step's update
  runs (the worker's generation waits for the update to start: a sequential run would time out),
  and ``time/rollout_wait_s`` is logged on both modes;
* :meth:`LaggedPolicy.upcoming` is the version the next :meth:`LaggedPolicy.advance` loads;
* the refusals. The kill/resume exactness of an overlapped run: tests/test_resume.py
  (``float64-stale-overlap``).
"""

from __future__ import annotations

import threading

import pytest
import torch

from harness.train.staleness import LaggedPolicy
from harness.launch.validate import ConfigError, validate
from tests.conftest import compose
from tests.knob_probe import BASE

F64 = "model.dtype=float64"
EXACT = dict(rel=1e-10, abs=1e-12)
STEPS = ("train.steps=4", "eval.every=3", "train.lr=0.05")  # evals at 0, 3, 4: the worker is drained before them


class _Recorder:
    """Wraps a backend; records each training call (prompts, output, the thread it ran on); ``gate``
    (optional) is called before the i-th training generation, with i."""

    def __init__(self, inner, gate=None):
        self.inner, self.gate, self.calls = inner, gate, []

    def generate(self, prompts, n, params):
        training = params.temperature > 0 and n > 1
        if training and self.gate is not None:
            self.gate(len(self.calls))
        out = self.inner.generate(prompts, n, params)
        if training:
            self.calls.append((list(prompts), params, out, threading.current_thread().name))
        return out

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def _run(*overrides, gate=None, on_update=None):
    """A tiny float64 run (the knob probe's set-up); returns (recorded training calls, metrics by
    step, the final weights, the trainer). ``on_update(trainer)`` runs as each update starts."""
    from harness.launch.run import prepare
    from harness.train.trainer import Trainer
    from tests.knob_probe import MemoryTracker, probe_components

    cfg = compose(*BASE, F64, *overrides)
    validate(cfg)
    threads = torch.get_num_threads()
    try:
        prepare(cfg)
        task, tok, policy, critic, backend = probe_components(cfg)
        rec = _Recorder(backend, gate)
        trainer = Trainer(cfg, task, tok, policy, rec, MemoryTracker(), critic=critic)
        if on_update is not None:
            update = trainer._update

            def hooked(tb):
                on_update(trainer)
                return update(tb)

            trainer._update = hooked
        history = trainer.fit()
    finally:
        torch.set_num_threads(threads)
    weights = torch.cat([p.detach().flatten() for p in policy.parameters()])
    return rec.calls, history, weights, trainer


# tools: the tiny model "calls" on any token with an "e" (tests/test_tools.py), so episodes have observations
TOOLS = ("tools=calculator", "tools.call_open=", "tools.call_close=e", "rollout.max_new_tokens=40")


@pytest.mark.parametrize("overrides", [("rollout.staleness=1",), ("rollout.staleness=2",),
                                       ("rollout.staleness=1", "group_filter=dapo"),
                                       ("rollout.staleness=1", "lora=peft", "lora.r=4"),
                                       ("rollout.staleness=1", *TOOLS)],
                         ids=["k1", "k2", "k1-dapo", "k1-lora", "k1-tools"])
def test_overlap_equals_sequential(overrides):
    """Same seeds, same batches: the rollouts (ids, masks, sampler log-probs) of every step, every
    logged metric but the timings, and the final weights."""
    seq_calls, seq_hist, seq_w, _ = _run(*STEPS, *overrides)
    ov_calls, ov_hist, ov_w, _ = _run(*STEPS, *overrides, "rollout.overlap=true")
    assert len(seq_calls) == len(ov_calls) >= 4
    assert any(name != "MainThread" for *_, name in ov_calls), "nothing was generated in the background"
    for i, (a, b) in enumerate(zip(seq_calls, ov_calls)):
        assert a[0] == b[0] and a[1] == b[1], f"call {i}: other prompts or sampling params"
        for f in ("completion_ids", "completion_mask", "truncated"):
            assert torch.equal(getattr(a[2], f), getattr(b[2], f)), f"call {i}: {f}"
        assert b[2].sampler_logprobs.flatten().tolist() == pytest.approx(a[2].sampler_logprobs.flatten().tolist(), **EXACT)
    assert sorted(seq_hist) == sorted(ov_hist) == [0, 1, 2, 3, 4]
    for step in seq_hist:
        a = {k: v for k, v in seq_hist[step].items() if not k.startswith(("time/", "perf/"))}
        b = {k: v for k, v in ov_hist[step].items() if not k.startswith(("time/", "perf/"))}
        assert sorted(a) == sorted(b), step
        for k in a:
            assert b[k] == pytest.approx(a[k], **EXACT), (step, k, a[k], b[k])
    k = int(overrides[0].split("=")[1])
    assert [seq_hist[s]["rollout/staleness_mean"] for s in (1, 2, 3, 4)] == [min(s - 1, k) for s in (1, 2, 3, 4)]
    assert ov_w.tolist() == pytest.approx(seq_w.tolist(), **EXACT)
    assert min(seq_hist[s]["train/grad_norm"] for s in (1, 2, 3, 4)) > 1e-3, "the weights did not move"
    if "tools=calculator" in overrides:  # the episodes (tool calls) ran in the worker
        assert all(b[2].observation_mask is not None for b in ov_calls)
    if "group_filter=dapo" in overrides:  # the filter resampled: its extra rounds ran in the worker too
        assert max(ov_hist[s]["train/prompts_sampled"] for s in (1, 2, 3, 4)) > 2


def test_generation_runs_while_the_update_runs():
    """Step t + 1's generation (t >= 1) waits until step t's update has started: it can only get
    past that in a thread beside the update (run on the trainer's thread it would time out). The
    wait for the batch is logged on every step; at step 1 (nothing prefetched) it is the whole
    collection."""
    started = {}

    def on_update(trainer):
        started.setdefault(trainer.step + 1, threading.Event()).set()

    def gate(i):  # training call i is step i + 1's generation
        if i >= 1:
            assert started.setdefault(i, threading.Event()).wait(timeout=120), f"step {i}'s update never started"

    calls, hist, _, trainer = _run("rollout.staleness=1", "train.steps=3", "eval.every=0", "rollout.overlap=true",
                                   gate=gate, on_update=on_update)
    assert [name.startswith("rollout-overlap") for *_, name in calls] == [False, True, True]
    for s in (1, 2, 3):
        assert hist[s]["time/rollout_wait_s"] >= 0.0, s
    assert hist[1]["time/rollout_wait_s"] >= hist[1]["time/rollout_s"] + hist[1]["time/reward_s"]
    assert not trainer.overlap.pending
    seq_calls, seq_hist, _, _ = _run("rollout.staleness=1", "train.steps=2", "eval.every=0")
    assert all(name == "MainThread" for *_, name in seq_calls)
    assert seq_hist[2]["time/rollout_wait_s"] >= seq_hist[2]["time/rollout_s"]


def test_upcoming_is_the_next_advance():
    """k = 1, 2, 3: before update v + 1 (the policy at version v), upcoming(v) is the version and the
    weights that advance(policy, v + 1) loads, and it changes nothing."""
    policy = torch.nn.Linear(2, 1, bias=False).double()

    def set_version(v):
        with torch.no_grad():
            policy.weight.fill_(float(v))

    for k in (1, 2, 3):
        set_version(0)
        lagged = LaggedPolicy(policy, k)
        for v in range(0, 6):
            before = (lagged.version, [p for p, _ in lagged.pending])
            version, state = lagged.upcoming(v)
            seen = (version, float(state["weight"][0, 0]))
            assert (lagged.version, [p for p, _ in lagged.pending]) == before
            set_version(v + 1)
            lagged.advance(policy, v + 1)
            assert seen == (lagged.version, float(lagged.module.weight[0, 0])) == (max(0, v + 1 - k),) * 2, (k, v)


@pytest.mark.parametrize("overrides, needle, world", [
    (("rollout.overlap=true",), "rollout.overlap=true with rollout.staleness=0", 1),
    (("rollout.overlap=true", "rollout.staleness=1"), "rollout.overlap=true with 2 torchrun ranks", 2),
    (("rollout.overlap=true", "rollout.staleness=1", "advantage=remax"), "rollout.overlap=true with advantage=remax", 1),
])
def test_refused(overrides, needle, world, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        validate(compose(*BASE, *overrides))


def test_refused_with_vllm_sleep(monkeypatch):
    """Sleep mode is GPU-only (refused here first): the overlap check is reached with a GPU pretended."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match=r"rollout\.overlap=true with rollout\.sleep=true"):
        validate(compose(*BASE, "rollout=vllm", "rollout.overlap=true", "rollout.staleness=1", "rollout.sleep=true"))
