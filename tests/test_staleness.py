"""Stale rollouts (``rollout.staleness=k``, :mod:`harness.train.staleness`) and the objective under
staleness (``offpolicy=``, :mod:`harness.algo.offpolicy`).

* ``staleness=0`` is today's on-policy run, to 1e-10 in float64 (the values below were measured
  on the code before staleness existed, commit 1fa8034, with :func:`tests.knob_probe.probe`);
* a ``staleness=1`` run's step-t rollouts are those sampled, with the same seeds, from the weights
  after update ``max(0, t - 2)``, and not those of the on-policy weights;
* the decoupled objective's weight and loss, computed by hand in float64;
* the refusals. The kill/resume exactness of a stale run: tests/test_resume.py.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from harness.algo import OFFPOLICY_OBJECTIVES, build_algorithm
from harness.rollout import build_backend
from harness.train.staleness import LaggedPolicy
from harness.train.update import token_objective
from harness.launch.validate import ConfigError, validate
from tests.conftest import compose
from tests.knob_probe import BASE, metric, probe

F64 = "model.dtype=float64"
EXACT = dict(rel=1e-10, abs=1e-12)

# probe(F64, *overrides) on commit 1fa8034 (before rollout.staleness and offpolicy existed): the
# per-step loss and grad norm, the final weights' sum and sum of squares, each step's first 12 token ids
MU2_TIS_KL = ("mu=2", "rollout_correction=token_truncate", "beta=0.5", "kl.placement=reward")
TODAY = {
    (): {"loss": [0.09523790649005345, -0.06553757219154091], "grad_norm": [9.997171417088156, 4.611808381132195],
         "w_sum": 666.5202628638012, "w_sq": 841.9476326174861,
         "ids": [[9247, 40937, 24292, 14435, 46222, 15558, 31536, 17313, 2, 2, 2, 2],
                 [29512, 47750, 2, 2, 2, 2, 48772, 47007, 28820, 21716, 38164, 35130]]},
    MU2_TIS_KL: {"loss": [0.07794947021611354, -0.07167162016076449],
                 "grad_norm": [6.085981300994746, 2.3581372206062245],
                 "w_sum": 1067.171534559087, "w_sq": 851.6303898492617,
                 "ids": [[9247, 40937, 24292, 14435, 46222, 15558, 31536, 17313, 2, 2, 2, 2],
                 [29512, 47750, 2, 2, 2, 2, 48772, 47007, 28820, 21716, 38164, 35130]]},
}


@pytest.mark.parametrize("overrides", list(TODAY), ids=["default", "mu2_tis_kl"])
def test_staleness_0_equals_todays_run(overrides):
    expected = TODAY[overrides]
    obs = probe(F64, "rollout.staleness=0", "offpolicy=behaviour", *overrides)
    w = obs["weights"]
    assert metric(obs, "train/loss")[1:] == pytest.approx(expected["loss"], **EXACT)
    assert metric(obs, "train/grad_norm")[1:] == pytest.approx(expected["grad_norm"], **EXACT)
    assert float(w.sum()) == pytest.approx(expected["w_sum"], **EXACT)
    assert float((w * w).sum()) == pytest.approx(expected["w_sq"], **EXACT)
    assert [c[0].flatten().tolist()[:12] for c in obs["rollout"]] == expected["ids"]
    assert metric(obs, "rollout/staleness_mean")[1:] == [0.0, 0.0]


class _Recorder:
    """Wraps a backend; records each training call's prompts, n and sampling params, and its output."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, n, params):
        out = self.inner.generate(prompts, n, params)
        if params.temperature > 0 and n > 1:
            self.calls.append((list(prompts), n, params, out))
        return out

    def sync_weights(self, model):
        self.inner.sync_weights(model)


def _stale_run(*overrides):
    """A tiny float64 run (the probe's set-up); returns (cfg, tokenizer, policy, recorded training
    calls, the policy's state dict after each step (version 0 first), metrics by step, step records)."""
    from harness.launch.run import prepare
    from harness.train.trainer import Trainer
    from tests.knob_probe import MemoryTracker, probe_components

    cfg = compose(*BASE, F64, *overrides)
    threads = torch.get_num_threads()
    try:
        prepare(cfg)
        task, tok, policy, critic, backend = probe_components(cfg)
        versions, records = [copy.deepcopy(policy.state_dict())], []

        def on_step(record):
            versions.append(copy.deepcopy(policy.state_dict()))
            records.append(record)

        rec = _Recorder(backend)
        trainer = Trainer(cfg, task, tok, policy, rec, MemoryTracker(), critic=critic, on_step=on_step)
        history = trainer.fit()
    finally:
        torch.set_num_threads(threads)
    return cfg, tok, policy, rec.calls, versions, history, records


def _regenerate(cfg, tok, policy, state, prompts, n, params):
    model = copy.deepcopy(policy)
    model.load_state_dict(state)
    return build_backend("hf", model.eval(), tok, **cfg.rollout).generate(prompts, n, params)


def test_stale_rollouts_are_sampled_from_the_lagged_weights():
    """staleness=1, 3 steps: step t samples with the weights after update max(0, t - 2); the same
    prompts and seeds on the on-policy weights (after update t - 1) give other completions at step
    3, so the comparison would catch a lag that is not there. The mismatch metrics compare the
    sampler with the trainer's behaviour log-probs (the same weights): at the stale steps they stay
    at step 1's level (the sampler's float32 log-softmax), far below the current policy's distance."""
    cfg, tok, policy, calls, versions, history, records = _stale_run("rollout.staleness=1", "train.steps=3", "train.lr=0.05")
    assert len(calls) == 3 and len(versions) == 4
    differs = []
    for t, (prompts, n, params, out) in enumerate(calls, start=1):
        lagged = _regenerate(cfg, tok, policy, versions[max(0, t - 2)], prompts, n, params)
        assert torch.equal(lagged.completion_ids, out.completion_ids), f"step {t}"
        assert torch.equal(lagged.completion_mask, out.completion_mask), f"step {t}"
        assert torch.equal(lagged.sampler_logprobs, out.sampler_logprobs), f"step {t}"
        if t >= 2:
            fresh = _regenerate(cfg, tok, policy, versions[t - 1], prompts, n, params)
            differs.append(not torch.equal(fresh.completion_ids, out.completion_ids))
    assert differs[-1], "step 3's on-policy weights sample the same completions: the test cannot see the lag"
    assert [history[s]["rollout/staleness_mean"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    on_policy = history[1]["rollout/logprob_diff_max"]
    assert 0 < on_policy < 1e-4  # float32 log-softmax over a 49k vocabulary
    r = records[2]  # step 3: the current policy's log-probs (its first pass) against the sampler's
    current = float(((r.logprobs - r.batch.sampler_logprobs).abs() * r.loss_mask).max())
    for s in (2, 3):
        assert history[s]["rollout/logprob_diff_max"] < 10 * on_policy < current / 100, (s, history[s], current)


def test_lagged_policy_walks_the_versions_and_restores_them():
    """k=2: after update v the behaviour weights are version max(0, v - 2); a state dict taken
    after any update, loaded into a fresh object, continues the same sequence."""
    torch.manual_seed(0)
    policy = torch.nn.Linear(2, 1, bias=False).double()

    def set_version(v):
        with torch.no_grad():
            policy.weight.fill_(float(v))

    set_version(0)
    lagged = LaggedPolicy(policy, 2)
    seen, states = [], {}
    for v in range(1, 6):
        set_version(v)
        module = lagged.advance(policy, v)
        seen.append((lagged.version, float(module.weight[0, 0]), lagged.lag(v)))
        states[v] = lagged.state_dict(v)
        assert len(lagged.pending) <= 2
    assert seen == [(0, 0.0, 1), (0, 0.0, 2), (1, 1.0, 2), (2, 2.0, 2), (3, 3.0, 2)]
    assert [v for v, _ in states[4]["pending"]] == [3]  # version 4 is the checkpoint's policy
    set_version(4)
    resumed = LaggedPolicy(policy, 2)
    resumed.load_state_dict(states[4], policy)
    set_version(5)
    assert float(resumed.advance(policy, 5).weight[0, 0]) == 3.0 and resumed.version == 3
    with pytest.raises(ValueError, match="rollout.staleness=1, but the checkpoint was written with rollout.staleness=2"):
        LaggedPolicy(policy, 1).load_state_dict(states[4], policy)


# ------------------------------------------------------------------------ the decoupled objective

def _fn(name, **params):
    spec = OFFPOLICY_OBJECTIVES.spec(name)
    return lambda *a: spec.fn(*a, spec.build(params))


def test_decoupled_weight_by_hand():
    """w_t = pi_prox / pi_behav where <= cap, else 0 (AReaL behav_imp_weight_cap); masked tokens 0."""
    prox = torch.tensor([[math.log(0.5), math.log(0.2), math.log(0.9)]], dtype=torch.float64)
    behav = torch.tensor([[math.log(0.4), math.log(0.02), math.log(0.3)]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    w, stats = _fn("decoupled", cap=5.0)(prox, behav, mask, None)
    assert w.tolist()[0] == pytest.approx([1.25, 0.0, 0.0], **EXACT)  # 0.2 / 0.02 = 10 > 5: dropped
    assert float(stats["offpolicy_weight_mean"]) == pytest.approx(0.625, **EXACT)
    assert float(stats["offpolicy_masked_frac"]) == pytest.approx(0.5, **EXACT)
    w, _ = _fn("decoupled", cap=None)(prox, behav, mask, None)
    assert w.tolist()[0] == pytest.approx([1.25, 10.0, 0.0], **EXACT)
    given = torch.tensor([[0.7, 3.0, 0.0]], dtype=torch.float64)  # a rollout correction's weights win
    assert _fn("decoupled")(prox, behav, mask, given)[0] is given
    assert _fn("behaviour")(prox, behav, mask, given) == (given, {})
    with pytest.raises(ValueError, match="offpolicy.cap=0"):
        _fn("decoupled", cap=0.0)(prox, behav, mask, None)
    with pytest.raises(ValueError, match="no sampler log-probs"):
        _fn("decoupled")(prox, None, mask, None)


def test_decoupled_loss_by_hand():
    """The decoupled PPO loss (AReaL eq. 5) through the run's objective, one token each:
    loss_t = -w_t * min(r_t A_t, clip(r_t, 0.8, 1.2) A_t), r_t = pi_theta / pi_prox,
    w_t = pi_prox / pi_behav (capped at 5).

    token 0: pi 0.6, prox 0.5, behav 0.4, A = 1:  r = 1.2 (no clip bites), w = 1.25 -> -1.5
    token 1: pi 0.9, prox 0.6, behav 0.3, A = 1:  r = 1.5 -> clipped 1.2, w = 2 -> -2.4
    token 2: pi 0.2, prox 0.4, behav 0.5, A = -2: r = 0.5 -> min(-1, -1.6) = -1.6, w = 0.8 -> 1.28
    token 3: pi 0.3, prox 0.6, behav 0.1, A = 1:  w = 6 > 5 -> 0
    """
    algo = build_algorithm(compose(*BASE, "offpolicy=decoupled", "beta=0"))
    assert algo.ratio_against_proximal
    logp = torch.log(torch.tensor([[0.6, 0.9, 0.2, 0.3]], dtype=torch.float64)).requires_grad_()
    prox = torch.log(torch.tensor([[0.5, 0.6, 0.4, 0.6]], dtype=torch.float64))
    behav = torch.log(torch.tensor([[0.4, 0.3, 0.5, 0.1]], dtype=torch.float64))
    adv = torch.tensor([[1.0, 1.0, -2.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    weights, _ = algo.offpolicy(prox, behav, mask, None)
    per_token, _ = token_objective(logp, prox, None, adv, mask, torch.zeros_like(adv), algo, weights=weights)
    assert per_token.detach().tolist()[0] == pytest.approx([-1.5, -2.4, 1.28, 0.0], **EXACT)
    # behaviour (the default): the ratio is taken against what the trainer passes as old
    assert not build_algorithm(compose(*BASE)).ratio_against_proximal


def test_offpolicy_knobs_reach_the_loss():
    """offpolicy=decoupled and its cap change a stale run's loss (what the knob rows check too)."""
    base = probe(F64, "rollout.staleness=1")
    dec = probe(F64, "rollout.staleness=1", "offpolicy=decoupled")
    capped = probe(F64, "rollout.staleness=1", "offpolicy=decoupled", "offpolicy.cap=1.0")
    step2 = [metric(o, "train/loss")[2] for o in (base, dec, capped)]
    assert len(set(step2)) == 3, step2
    assert metric(capped, "train/offpolicy_masked_frac")[2] > 0


@pytest.mark.parametrize("overrides, needle", [
    (("rollout.staleness=-1",), "rollout.staleness=-1: expected >= 0"),
    (("rollout.staleness=1", "train.sharding=fsdp2"), "rollout.staleness=1 with train.sharding=fsdp2"),
    (("offpolicy=decoupled", "rollout_correction=token_truncate", "offpolicy.cap=2.0"),
     "offpolicy.cap=2.0 is set, but with rollout_correction=token_truncate"),
    (("offpolicy=decoupled", "offpolicy.cap=-1.0"), "offpolicy.cap=-1.0: expected a number > 0"),
])
def test_refused(overrides, needle, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # what train.sharding=fsdp2 needs before its staleness check
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.").replace("(", r"\(")):
        validate(compose(*BASE, *overrides))


def test_stale_run_samples_with_the_lagged_module_and_evaluates_the_policy():
    """The hf backend generates with the behaviour module during training and with the policy
    during evaluation (eval measures the trained weights)."""
    from harness.train.trainer import Trainer
    from tests.knob_probe import MemoryTracker

    seen = []

    class Spy:
        def __init__(self):
            self.model = None

        def sync_weights(self, model):
            self.model = model

        def generate(self, prompts, n, params):
            seen.append((params.temperature == 0 and n == 1, self.model))
            raise StopIteration

    cfg = compose(*BASE, F64, "rollout.staleness=1")
    from harness.launch.run import build_components, prepare
    prepare(cfg)
    task, tok, policy, critic, _ = build_components(cfg)
    trainer = Trainer(cfg, task, tok, policy, Spy(), MemoryTracker(), critic=critic)
    with pytest.raises(StopIteration):
        trainer.run_eval(0)
    with pytest.raises(StopIteration):
        trainer.collect()
    assert seen[0][1] is policy and seen[1][1] is trainer.lagged.module
    assert trainer.backend.model is trainer.lagged.module  # put back after the eval
