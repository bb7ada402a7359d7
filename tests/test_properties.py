"""Property tests over every registered variant (hypothesis): estimators, policy losses, KL forms,
loss aggregations and rollout corrections.

Each registry is enumerated, so a new variant is covered without an edit here. Generated batches
include near-constant groups, all-equal groups, one member different, huge and tiny magnitudes,
empty and one-token rows, and (where a variant takes any mask) masks with holes. For every variant:

* **float32 = float64.** The variant runs on float32 inputs and on their exact float64 image; the
  two results agree within a tolerance derived from float32's unit roundoff ``u = 2^-24`` and the
  computation's conditioning (stated at each check). Estimators compute in float64 by convention
  (the trainer's call, ``harness.algo.estimators.Estimator``), so theirs is the final rounding only.
* **Finite** results, whatever the magnitudes.
* **Declared invariances** (``Registry.register(..., invariances=...)``), checked exactly in
  float64 on well-conditioned data (dyadic values, so a shift or a power-of-two scale is exact):

  - estimators: ``permutation`` (of a group's members), ``shift`` (r + c), ``scale`` (c r, same
    advantages), ``scale_equivariant`` (c r gives c A), ``constant_zero`` (a group whose valid
    rewards are all equal gets exactly 0);
  - policy losses: ``permutation`` (of rows), ``scale_equivariant`` (c A gives c loss),
    ``zero_advantage`` (A = 0 gives 0);
  - KL forms: ``zero_at_equal``, ``nonnegative``;
  - aggregations: ``permutation``, ``scale_equivariant``, ``micro_batch_additive``;
  - rollout corrections: ``permutation``, ``on_policy_ones``, ``capped``.

Examples are derandomized (the same cases in every CI run); ``HYPOTHESIS_PROFILE=thorough`` runs
more.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.algo import (KL_ESTIMATORS, LOSS_AGGREGATIONS, POLICY_LOSSES, ROLLOUT_CORRECTIONS, TOKEN_ESTIMATORS,
                          aggregate_loss)
from harness.algo.aggregation import aggregation_normalizers
from harness.algo.estimators import AdvantageContext, Estimator

U32 = 2.0 ** -24  # float32 unit roundoff
settings.register_profile("ci", max_examples=40, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=1000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

SCALES = [1e-4, 1.0, 1e4]  # tiny, unit and huge reward magnitudes
KINDS = ["random", "near_constant", "all_equal", "one_different", "binary"]


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float, atol: float, what: str) -> None:
    """``|a - b| <= atol + rtol |b|`` elementwise; the message names the worst element."""
    a, b = a.double(), b.double()
    err = (a - b).abs() - (atol + rtol * b.abs())
    if bool((err > 0).any()):
        i = int(err.flatten().argmax())
        idx = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), a.shape)) if a.dim() else ()
        raise AssertionError(f"{what}: at {idx} {a.flatten()[i].item()!r} vs {b.flatten()[i].item()!r} "
                             f"(|d| = {(a - b).abs().flatten()[i].item():.3e}, tolerance "
                             f"{atol:.3e} + {rtol:.1e}*|b|)")


# ----------------------------------------------------------------------------- generators
@st.composite
def reward_batch(draw, min_group: int = 2, exact: bool = False):
    """``(rewards [P, G] float64 of float32 values, lengths [B], T)``.

    ``exact``: dyadic values (multiples of 1/8 times a power of two) so shifts and power-of-two
    scales are exact and an invariance can be checked to the last bit.
    """
    P = draw(st.integers(1, 3))
    G = draw(st.integers(min_group, 6))
    T = draw(st.integers(1, 4))
    kind = draw(st.sampled_from(KINDS if not exact else ["random", "all_equal", "one_different", "binary"]))
    if exact:  # spreads >= 1/8: the eps a variant adds to a std (<= 1e-6) moves a scale check < 1e-4
        scale = 2.0 ** draw(st.integers(0, 6))
        grid = st.integers(-16, 16).map(lambda k: k / 8 * scale)
    else:
        scale = draw(st.sampled_from(SCALES))
        grid = st.floats(-2.0, 2.0, allow_nan=False).map(lambda x: x * scale)
    rows = []
    for _ in range(P):
        base = draw(grid)
        if kind == "random":
            row = [draw(grid) for _ in range(G)]
        elif kind == "all_equal":
            row = [base] * G
        elif kind == "one_different":
            row = [base] * G
            row[draw(st.integers(0, G - 1))] = draw(grid)
        elif kind == "binary":
            row = [scale * draw(st.integers(0, 1)) for _ in range(G)]
        else:  # near_constant: a spread of 1e-9 .. 1e-3 of the scale around a common value
            rel = 10.0 ** draw(st.integers(-9, -3))
            row = [base + scale * rel * draw(st.floats(-1, 1, allow_nan=False)) for _ in range(G)]
        rows.append(row)
    rewards = torch.tensor(rows, dtype=torch.float32).double()  # float32 values, exactly in float64
    lengths = torch.tensor([draw(st.integers(0 if not exact else 1, T)) for _ in range(P * G)])
    if not exact and draw(st.booleans()):  # one-token rows
        lengths = lengths.clamp(max=1)
    return rewards, lengths, T


def _mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    return (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).double()


def _context(draw, spec, rewards, lengths, T) -> AdvantageContext:
    """A float64 context from scores: the outcome reward at each row's last valid token, and what
    the estimator ``needs`` (values, step rewards, greedy scores)."""
    P, G = rewards.shape
    B = P * G
    mask = _mask(lengths, T)
    token_rewards = torch.zeros(B, T, dtype=torch.float64)
    flat = rewards.reshape(-1)
    for b in range(B):
        if lengths[b] > 0:
            token_rewards[b, lengths[b] - 1] = flat[b]
    scale = float(rewards.abs().max()) or 1.0
    values = step_rewards = greedy = None
    if "values" in spec.needs:
        values = torch.tensor([[draw(st.floats(-1, 1, allow_nan=False)) * scale for _ in range(T)]
                               for _ in range(B)], dtype=torch.float32).double() * mask
    if "step_rewards" in spec.needs:
        step_rewards = []
        for b in range(B):
            ends = sorted(draw(st.sets(st.integers(0, max(int(lengths[b]) - 1, 0)), max_size=int(lengths[b]))))
            # every step of a row scores the row's reward (so a constant group has constant steps)
            step_rewards.append([(e, float(flat[b])) for e in ends])
    if "greedy" in spec.needs:
        greedy = torch.tensor([draw(st.floats(-1, 1, allow_nan=False)) * scale for _ in range(P)],
                              dtype=torch.float32).double()
    comps = weights = None
    if "reward_components" in spec.needs:  # the reward and a second component (its sign), weights 1 and 0.5
        comps = torch.stack([rewards, (rewards > 0).double()], dim=-1)
        weights = torch.tensor([1.0, 0.5], dtype=torch.float64)
    return AdvantageContext(scores=rewards, token_rewards=token_rewards, mask=mask, values=values,
                            step_rewards=step_rewards, greedy_scores=greedy, reward_components=comps,
                            reward_weights=weights)


def _cast(ctx: AdvantageContext, dtype) -> AdvantageContext:
    c = lambda x: x.to(dtype) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return AdvantageContext(scores=c(ctx.scores), token_rewards=c(ctx.token_rewards), mask=c(ctx.mask),
                            values=c(ctx.values), step_rewards=ctx.step_rewards, greedy_scores=c(ctx.greedy_scores),
                            reward_components=c(ctx.reward_components), reward_weights=c(ctx.reward_weights))


def _transform(ctx: AdvantageContext, fn) -> AdvantageContext:
    """Apply ``fn`` to every reward input (scores, token rewards at the valid tokens, greedy scores,
    step rewards, each reward component); values, masks and component weights unchanged."""
    tr = torch.where(ctx.token_rewards != 0, fn(ctx.token_rewards), ctx.token_rewards)
    lengths = ctx.mask.sum(-1).long()
    for b in range(tr.shape[0]):
        if lengths[b] > 0:
            tr[b, lengths[b] - 1] = fn(ctx.scores.reshape(-1)[b])
    steps = None if ctx.step_rewards is None else [[(e, float(fn(torch.tensor(r, dtype=torch.float64))))
                                                     for e, r in row] for row in ctx.step_rewards]
    return AdvantageContext(scores=fn(ctx.scores), token_rewards=tr, mask=ctx.mask, values=ctx.values,
                            step_rewards=steps, greedy_scores=None if ctx.greedy_scores is None else fn(ctx.greedy_scores),
                            reward_components=None if ctx.reward_components is None else fn(ctx.reward_components),
                            reward_weights=ctx.reward_weights)


def _permute(ctx: AdvantageContext, perm: torch.Tensor) -> AdvantageContext:
    """Permute the members of every group by ``perm`` (a permutation of range(G))."""
    P, G = ctx.scores.shape
    rows = (torch.arange(P).unsqueeze(1) * G + perm.unsqueeze(0)).reshape(-1)
    pick = lambda x: None if x is None else x[rows]  # noqa: E731
    return AdvantageContext(scores=ctx.scores[:, perm], token_rewards=ctx.token_rewards[rows], mask=ctx.mask[rows],
                            values=pick(ctx.values), greedy_scores=ctx.greedy_scores,
                            step_rewards=None if ctx.step_rewards is None else [ctx.step_rewards[r] for r in rows.tolist()],
                            reward_components=None if ctx.reward_components is None else ctx.reward_components[:, perm],
                            reward_weights=ctx.reward_weights)


def _estimate(spec, params, ctx):
    return Estimator(spec, params)(ctx).advantages  # as the trainer calls it


# Parameter settings beyond the defaults whose numerics differ (each row is run like a default).
PARAM_CASES = {
    "grpo": [{"scale": "batch"}, {"scale": "none"}, {"eps": 0.0}],
    "rloo": [{"scale": "loo_std"}, {"scale": "loo_std", "unbiased": True, "eps": 1e-6}],
    "reinforce": [{"baseline": "none"}],
    "grpo_passk": [{"scale": False}],
    "reinforce_pp": [{"unbiased": False}],
    "ppo": [{"whiten": False}],
    "gpg": [{"alpha": "nonzero"}, {"scale": "group", "eps": 1e-6}],  # the scale check allows eps / std <= 1e-4
}
EST_CASES = [(n, kw) for n in TOKEN_ESTIMATORS.names() for kw in [{}] + PARAM_CASES.get(n, [])]


@pytest.mark.parametrize("name,kw", EST_CASES, ids=[f"{n}{kw or ''}" for n, kw in EST_CASES])
def test_estimator_float32_equals_float64_and_is_finite(name, kw):
    spec = TOKEN_ESTIMATORS.spec(name)
    params = spec.build(kw)

    @settings(settings.get_profile(PROFILE))
    @given(st.data())
    def check(data):
        rewards, lengths, T = data.draw(reward_batch(min_group=2 if spec.grouped else 1))
        ctx = _context(data.draw, spec, rewards, lengths, T)
        a64 = _estimate(spec, params, ctx)
        a32 = _estimate(spec, params, _cast(ctx, torch.float32))
        assert a32.dtype == torch.float32
        assert bool(torch.isfinite(a64).all()) and bool(torch.isfinite(a32).all()), (a64, a32)
        # Computed in float64 by convention: the float32 result is the float64 one rounded once.
        _close(a32, a64, rtol=2 * U32, atol=1e-30, what=f"{name}: float32 vs float64")
        if "constant_zero" in spec.invariances_for(params):
            valid = ctx.mask.sum(-1).reshape(rewards.shape) > 0
            for p in range(rewards.shape[0]):
                r = rewards[p][valid[p]]
                if len(r) and bool((r == r[0]).all()):
                    G = rewards.shape[1]
                    assert bool((a64[p * G:(p + 1) * G] == 0).all()), f"{name}: constant group {p} got {a64}"

    check()


@pytest.mark.parametrize("name,kw", EST_CASES, ids=[f"{n}{kw or ''}" for n, kw in EST_CASES])
def test_estimator_declared_invariances(name, kw):
    spec = TOKEN_ESTIMATORS.spec(name)
    params = spec.build(kw)
    inv = spec.invariances_for(params)
    assert inv, f"{name} declares no invariance: declare at least the ones it has"

    @settings(settings.get_profile(PROFILE))
    @given(st.data())
    def check(data):
        rewards, lengths, T = data.draw(reward_batch(min_group=2 if spec.grouped else 1, exact=True))
        ctx = _context(data.draw, spec, rewards, lengths, T)
        a = _estimate(spec, params, ctx)
        scale = max(float(a.abs().max()), 1e-300)
        tol = dict(rtol=1e-12, atol=1e-12 * scale)
        if "permutation" in inv:
            perm = torch.tensor(data.draw(st.permutations(range(rewards.shape[1]))))
            P, G = rewards.shape
            rows = (torch.arange(P).unsqueeze(1) * G + perm.unsqueeze(0)).reshape(-1)
            _close(_estimate(spec, params, _permute(ctx, perm)), a[rows], what=f"{name}: permutation", **tol)
        if "shift" in inv:
            c = float(rewards.abs().max()) * data.draw(st.sampled_from([-3.0, 0.5, 2.0])) or 1.0
            _close(_estimate(spec, params, _transform(ctx, lambda x: x + c)), a, what=f"{name}: shift by {c}", **tol)
        for c in (4.0, 0.25):
            if "scale" in inv:  # exact up to the eps a variant adds to a std: rtol 1e-4 covers eps / std
                _close(_estimate(spec, params, _transform(ctx, lambda x: x * c)), a, rtol=1e-4, atol=1e-4 * scale,
                       what=f"{name}: scale by {c}")
            if "scale_equivariant" in inv:
                _close(_estimate(spec, params, _transform(ctx, lambda x: x * c)), c * a,
                       what=f"{name}: scale by {c}", rtol=1e-12, atol=1e-12 * scale * c)

    check()


# ----------------------------------------------------------------------------- token-level inputs
@st.composite
def token_batch(draw):
    """``(logprobs, old_logprobs, advantages, mask)`` float64 of float32 values, ``[B, T]``; the mask
    may have holes (e.g. observation tokens), rows may be empty."""
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    depth = draw(st.sampled_from([1e-3, 1.0, 20.0]))  # how negative the log-probs go
    drift = draw(st.sampled_from([0.0, 1e-6, 1e-3, 0.3, 3.0]))  # |log pi - log pi_old|
    amp = draw(st.sampled_from(SCALES))
    cell = st.floats(0, 1, allow_nan=False)
    lp = torch.tensor([[-depth * draw(cell) for _ in range(T)] for _ in range(B)])
    old = lp + torch.tensor([[drift * (2 * draw(cell) - 1) for _ in range(T)] for _ in range(B)])
    adv_rows = [amp * (2 * draw(cell) - 1) for _ in range(B)]
    per_token = draw(st.booleans())
    adv = torch.tensor([[adv_rows[b] * (1 + (0.5 * draw(cell) if per_token else 0)) for _ in range(T)]
                        for b in range(B)])
    mask = torch.tensor([[float(draw(st.integers(0, 4)) > 0) for _ in range(T)] for _ in range(B)])
    f = lambda x: x.float().double()  # noqa: E731  float32 values
    return f(lp).clamp(max=0), f(old).clamp(max=0), f(adv), mask.double()


def _loss(spec, params, lp, old, adv, mask, weights=None, seed=0):
    torch.manual_seed(seed)  # clip_cov draws its tokens at random
    loss, _ = spec.fn(lp, old, adv, mask, params, weights=weights)
    return loss


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_policy_loss_float32_equals_float64_and_invariances(name):
    spec = POLICY_LOSSES.spec(name)
    params = spec.build()
    inv = spec.invariances_for(params)

    @settings(settings.get_profile(PROFILE))
    @given(token_batch(), st.booleans())
    def check(batch, weighted):
        lp, old, adv, mask = batch
        w = torch.exp(-(lp - old).abs()).float().double() * mask if weighted else None
        l64 = _loss(spec, params, lp, old, adv, mask, w)
        l32 = _loss(spec, params, lp.float(), old.float(), adv.float(), mask.float(), None if w is None else w.float())
        assert l32.dtype == torch.float32 and bool(torch.isfinite(l64).all()) and bool(torch.isfinite(l32).all())
        # float32 error: the log-ratio log pi - log pi_old is rounded to u |log pi| at worst, the
        # ratio and every product to a few u; the loss is ~|A| ratio |log pi| in size (CISPO, PG).
        big = float((adv.abs().amax() * (1 + lp.abs().amax())) * torch.exp((lp - old).abs().amax().clamp(max=30)))
        _close(l32, l64, rtol=64 * U32, atol=64 * U32 * (1 + float(lp.abs().max())) * big,
               what=f"{name}: float32 vs float64")
        assert bool((l64[mask == 0] == 0).all()), f"{name}: loss at a masked position"
        if "permutation" in inv:
            perm = torch.randperm(lp.shape[0], generator=torch.Generator().manual_seed(1))
            pw = None if w is None else w[perm]
            _close(_loss(spec, params, lp[perm], old[perm], adv[perm], mask[perm], pw), l64[perm], rtol=1e-12,
                   atol=1e-12 * big, what=f"{name}: permutation")
        if "scale_equivariant" in inv:
            _close(_loss(spec, params, lp, old, 4 * adv, mask, w), 4 * l64, rtol=1e-12, atol=1e-12 * big,
                   what=f"{name}: 4 A")
        if "zero_advantage" in inv:
            assert bool((_loss(spec, params, lp, old, torch.zeros_like(adv), mask, w) == 0).all()), name

    check()


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_kl_form_float32_equals_float64_and_invariances(name):
    fn = KL_ESTIMATORS.get(name)
    inv = KL_ESTIMATORS.spec(name).invariances_for()

    @settings(settings.get_profile(PROFILE))
    @given(token_batch())
    def check(batch):
        lp, ref, _, _ = batch
        k64, k32 = fn(lp, ref), fn(lp.float(), ref.float())
        assert bool(torch.isfinite(k64).all()) and bool(torch.isfinite(k32).all())
        # The inputs are the same float32 numbers: the float32 path rounds x = ref - lp (u |x|)
        # and each operation after it; k is O(|x| (1 + e^x)) sensitive to x.
        x = (ref - lp).abs()
        err = (k32.double() - k64).abs()
        bound = 8 * U32 * (x * (1 + torch.exp(x)) + k64.abs()) + 1e-45
        assert bool((err <= bound).all()), f"{name}: float32 vs float64 error {float((err - bound).max()):.3e} past bound"
        if "zero_at_equal" in inv:
            assert bool((fn(lp, lp) == 0).all()) and bool((fn(lp.float(), lp.float()) == 0).all()), name
        if "nonnegative" in inv:
            assert bool((k64 >= 0).all()) and bool((k32 >= 0).all()), f"{name}: negative estimate"

    check()


@pytest.mark.parametrize("name", LOSS_AGGREGATIONS.names())
def test_aggregation_float32_equals_float64_and_invariances(name):
    spec = LOSS_AGGREGATIONS.spec(name)
    inv = spec.invariances_for()

    @settings(settings.get_profile(PROFILE))
    @given(token_batch(), st.integers(1, 4))
    def check(batch, split):
        lp, _, adv, mask = batch
        loss = adv * lp  # any per-token loss
        agg = lambda l, m, **kw: aggregate_loss(l, m, name, max_len=l.shape[1], **kw)  # noqa: E731
        v64, v32 = agg(loss, mask), agg(loss.float(), mask.float())
        assert bool(torch.isfinite(v64)) and bool(torch.isfinite(v32))
        # a sum of N terms: error N u sum |terms| (each term rounded once, then summed)
        n = float(mask.numel())
        size = float((loss.abs() * mask).sum()) / max(float(mask.sum()), 1.0) * n
        _close(v32, v64, rtol=0.0, atol=4 * n * U32 * size + 1e-300, what=f"{name}: float32 vs float64")
        tol = dict(rtol=1e-12, atol=1e-12 * (size + 1e-300))
        if "permutation" in inv:
            perm = torch.randperm(loss.shape[0], generator=torch.Generator().manual_seed(2))
            _close(agg(loss[perm], mask[perm]), v64, what=f"{name}: permutation", **tol)
        if "scale_equivariant" in inv:
            _close(agg(4 * loss, mask), 4 * v64, what=f"{name}: 4 x loss", **tol)
        if "micro_batch_additive" in inv:
            counts = aggregation_normalizers(mask)  # the whole batch's, as the trainer passes them
            parts = sum(agg(loss[i:i + split], mask[i:i + split], **counts) for i in range(0, loss.shape[0], split))
            _close(parts, v64, what=f"{name}: micro-batches of {split} rows", **tol)

    check()


@pytest.mark.parametrize("name", ROLLOUT_CORRECTIONS.names())
def test_rollout_correction_float32_equals_float64_and_invariances(name):
    entry = ROLLOUT_CORRECTIONS.spec(name)
    params = entry.build()
    inv = entry.invariances_for(params)

    class spec:  # noqa: N801  the variant with the inputs it declares, each a function of the row
        @staticmethod
        def fn(lr, mask, p):
            inputs = {"advantages": torch.where(lr[:, :1] >= 0, 1.0, -1.0).to(lr.dtype).expand_as(lr),
                      "current_log_ratio": lr}
            return entry.fn(lr, mask, p, **{k: v for k, v in inputs.items() if k in entry.needs})

    @settings(settings.get_profile(PROFILE))
    @given(token_batch())
    def check(batch):
        lp, old, _, mask = batch
        lr = (lp - old) * mask
        w64, w32 = spec.fn(lr, mask, params), spec.fn(lr.float(), mask.float(), params)
        if w64 is None:
            assert w32 is None
        else:
            assert bool(torch.isfinite(w64).all()) and bool(torch.isfinite(w32).all())
            # exp of a sum of <= T log-ratios: relative error (T + 2) u (1 + |sum|); a weight that
            # sits on the cap's edge may be masked in one precision and not the other: none is
            # generated (the drifts are continuous draws).
            t = float(mask.shape[1])
            seq = (lr.abs().sum(-1, keepdim=True) + 1).expand_as(lr)
            err, bound = (w32.double() - w64).abs(), (t + 2) * 2 * U32 * seq * w64.abs() + 1e-300
            assert bool((err <= bound).all()), f"{name}: float32 vs float64 error {float((err - bound).max()):.3e}"
            assert bool((w64[mask == 0] == 0).all()), f"{name}: weight at a masked position"
        if "permutation" in inv and w64 is not None:
            perm = torch.randperm(lr.shape[0], generator=torch.Generator().manual_seed(3))
            _close(spec.fn(lr[perm], mask[perm], params), w64[perm], rtol=1e-12, atol=0.0, what=f"{name}: permutation")
        if "on_policy_ones" in inv:
            w = spec.fn(torch.zeros_like(lr), mask, params)
            assert w is None or bool((w == mask).all()), f"{name}: on-policy weights {w}"
        if "capped" in inv:
            assert bool((w64 <= params.cap).all()), f"{name}: weight above the cap {params.cap}"

    check()


# ----------------------------------------------------------------------------- rloo, the case
def test_rloo_loo_std_float32_with_equal_others_gives_the_unscaled_advantage():
    """Six of seven equal others (0.95) and one 0: the leave-one-out std of row 0 is exactly 0, so
    its advantage is r - b = -0.95, unscaled; mean(r^2) - b^2 in float32 left 4.2e-4 and -2247."""
    from harness.algo.advantages import RLOOParams

    r = torch.tensor([[0.0] + [0.95] * 7])
    ctx = AdvantageContext(scores=r, token_rewards=torch.zeros(8, 3), mask=torch.ones(8, 3))
    a = TOKEN_ESTIMATORS.get("rloo")(ctx, RLOOParams(scale="loo_std")).advantages[:, 0]
    assert a[0].item() == pytest.approx(-0.95, abs=1e-4)
    # the others: b = 0.95 * 6/7, std of the others (one 0, six 0.95) = 0.95 sqrt(6)/7
    b, s = 0.95 * 6 / 7, 0.95 * 6 ** 0.5 / 7
    assert a[1:].tolist() == pytest.approx([(0.95 - b) / s] * 7, rel=1e-6)


# ----------------------------------------------------------------------------- through the trainer
def _shaped_verdicts(completions, golds):
    """In each group of 4 (a call's rows are group-major), member 0 gets reward 0 and the others
    the format reward (0.95 here): the shaped-reward group of the rloo case, on every step."""
    from harness.verifiers import Verdict

    return [Verdict(correct=False, formatted=i % 4 != 0, extracted=None, status="ok") for i in range(len(completions))]


WIRING = [("rloo", ("advantage.scale=loo_std",)), ("grpo", ("advantage.eps=0.0",)), ("reinforce_pp", ()),
          ("opo", ())]


@pytest.mark.parametrize("name,extra", WIRING, ids=[w[0] for w in WIRING])
def test_trainer_step_gives_the_float64_estimate_on_shaped_rewards(name, extra):
    """``Trainer.train_step`` on the tiny model, with the verifier's verdicts forced so every group
    is [0, 0.95, 0.95, 0.95]: the advantages the update used equal the registered estimator run
    in float64 on the step's scores and masks (one float32 rounding), and are finite."""
    from tests.knob_probe import probe

    obs = probe(f"advantage={name}", *extra, "task.format_reward=0.95", "beta=0", "group_size=4",
                reward=_shaped_verdicts)
    spec = TOKEN_ESTIMATORS.spec(name)
    params = spec.build(obs["cfg"].advantage)
    assert len(obs["records"]) == 2
    for rec in obs["records"]:
        mask = rec.batch.completion_mask.double()
        lengths = mask.sum(-1).long()
        scores = rec.scores.double()
        assert scores.reshape(-1).tolist() == pytest.approx([0.0, 0.95, 0.95, 0.95] * (len(lengths) // 4))
        tr = torch.zeros_like(mask)
        tr[torch.arange(len(lengths)), lengths - 1] = scores.reshape(-1)
        want = spec.fn(AdvantageContext(scores=scores, token_rewards=tr, mask=mask), params).advantages
        got = rec.advantages
        assert got.dtype == torch.float32 and bool(torch.isfinite(got).all())
        _close(got, want[:, :got.shape[1]], rtol=2 * U32, atol=1e-30, what=f"{name}: trainer vs float64 estimator")
        if name == "rloo":  # the issue's case: member 0's others agree -> -0.95 unscaled; others 1/sqrt(2)
            first = got[::4][mask[::4] > 0]
            assert first.tolist() == pytest.approx([-0.95] * len(first), abs=1e-6)
            rest = got.reshape(-1, 4, got.shape[1])[:, 1:][mask.reshape(-1, 4, mask.shape[1])[:, 1:] > 0]
            assert rest.tolist() == pytest.approx([2 ** -0.5] * len(rest), rel=1e-6)
