"""Golden tests of the peer tables in docs/knobs.md ("Against the peers, variant by variant"),
policy losses, loss aggregations, KL estimators and rollout corrections (the advantage estimators
are in tests/test_peer_golden.py): for each row that says "same with `<knobs>`", the peer's formula
written out here from the code read (file, function and commit named in each docstring; no peer
package is imported), fed inputs that separate the conventions (fully masked rows, masked tokens,
unequal lengths, ratios on both sides of every clip, log-ratios past every clamp), and the harness
with those knobs equals it to 1e-12 in float64. Each test also shows that the knob is on: without
it the harness differs.

Commits read: TRL f2cd577 (2026-07-24), verl b178a3c (2026-01-29), OpenRLHF 3c3be62 (2026-08-13),
NeMo-RL 7ea279a (2026-08-22).
"""

from __future__ import annotations

import math

import torch

from harness.algo import POLICY_LOSSES, ROLLOUT_CORRECTIONS, kl_penalty
from harness.algo.aggregation import aggregate_loss

F64 = torch.float64
TOL = dict(rtol=1e-12, atol=1e-12)

# A token batch: 4 rows, unequal lengths, one fully masked row (an empty / masked completion).
LENGTHS = [3, 1, 0, 5]
MASK = (torch.arange(5)[None] < torch.tensor(LENGTHS)[:, None]).to(F64)
LOG_RATIO = torch.linspace(-0.9, 1.5, 20, dtype=F64).reshape(4, 5)  # ratios 0.41 ... 4.5
ADV_ROWS = torch.tensor([1.3, -0.7, 0.4, -1.1], dtype=F64)
ADV = ADV_ROWS[:, None].expand(4, 5).clone()


def _loss(name: str, **params):
    """Harness per-token loss of ``name`` on the token batch; logp carries the gradient."""
    logp = (LOG_RATIO - 1.0).clone().requires_grad_()
    spec = POLICY_LOSSES.spec(name)
    per_token, _ = spec.fn(logp, (LOG_RATIO - 1.0) - LOG_RATIO, ADV, MASK, spec.build(**params))
    return logp, per_token


def _seq_token_mean_all_rows(per_token: torch.Tensor) -> torch.Tensor:
    """TRL's loss_type "grpo"/"sapo" reduction: ((l * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()."""
    return ((per_token * MASK).sum(-1) / MASK.sum(-1).clamp(min=1.0)).mean()


# ----------------------------------------------------------------- policy losses and aggregation


def test_trl_compute_loss_loss_type_sapo():
    """TRL f2cd577, `trl/trainer/grpo_trainer.py` `GRPOTrainer._compute_loss`, `loss_type="sapo"`: per token
    `-sigmoid(tau (r - 1)) 4 / tau * A` (`tau` = `sapo_temperature_pos` 1.0 where `A > 0`, else
    `sapo_temperature_neg` 1.05), reduced as `"grpo"`: each row's token mean, then the mean over
    all rows, a fully masked one too. Harness: `policy_loss=sapo
    loss_agg=seq-mean-token-mean loss_agg.count_masked_rows=true`, to 1e-12 against `tau` in
    float64. TRL builds `tau` as `torch.where(advantages > 0, 1.0, 1.05)`, a float32 tensor (two
    Python floats), so its 1.05 runs as 1.0499999523162842: verbatim TRL lies 6.6e-8 (relative)
    from this loss (measured, asserted)."""
    logp, per_token = _loss("sapo")
    ratio = LOG_RATIO.exp()
    tau = torch.where(ADV > 0, torch.full_like(ADV, 1.0), torch.full_like(ADV, 1.05))
    trl = _seq_token_mean_all_rows(-torch.sigmoid(tau * (ratio - 1)) * 4 / tau * ADV)
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-mean", count_masked_rows=True)
    torch.testing.assert_close(ours, trl, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "seq-mean-token-mean"), trl)
    tau32 = torch.where(ADV > 0, 1.0, 1.05)  # TRL's verbatim tau
    trl32 = _seq_token_mean_all_rows(-torch.sigmoid(tau32 * (ratio - 1)) * 4 / tau32 * ADV)
    assert tau32.dtype == torch.float32 and 6.5e-8 < abs(float(trl32 / trl) - 1) < 6.7e-8


def test_verl_compute_policy_loss_geo_mean():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py` `compute_policy_loss_geo_mean`: per row
    `-A exp(mean_t sgn(A) min(sgn(A) x_t, sgn(A) clamp(x_t, -eps_low, eps_high)))`, `x = log r`,
    then `torch.mean` over *all* rows (a fully masked row adds 0 and counts). verl's `+ 1e-8` in
    the two length divisions (a relative 1e-8 / L) is left out. Harness: `policy_loss=gmpo
    loss_agg=seq-mean-token-mean loss_agg.count_masked_rows=true`."""
    logp, per_token = _loss("gmpo", epsilon=0.4)
    sgn = torch.sign(ADV)
    x_min = sgn * torch.minimum(sgn * LOG_RATIO, sgn * LOG_RATIO.clamp(-0.4, 0.4))
    L = MASK.sum(-1)
    rows = torch.zeros(4, dtype=F64)
    valid = L > 0
    rows[valid] = -ADV_ROWS[valid] * torch.exp((x_min * MASK).sum(-1)[valid] / L[valid])
    verl = rows.mean()
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-mean", count_masked_rows=True)
    torch.testing.assert_close(ours, verl, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "seq-mean-token-mean"), verl)


def test_verl_compute_policy_loss_vanilla_dual_clip_3():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py`
    `compute_policy_loss_vanilla`: `-min(r A, clip(r, 1 - 0.2, 1 + 0.2) A)`,
    and where `A < 0` the dual clip `min(that, -3 A)` (`clip_ratio_c` 3.0, always on), token-mean
    (`agg_loss`). Harness: `policy_loss=ppo_clip policy_loss.dual_clip=3`."""
    logp, per_token = _loss("ppo_clip", dual_clip=3.0)
    r = LOG_RATIO.exp()
    l1 = torch.maximum(-ADV * r, -ADV * r.clamp(0.8, 1.2))
    verl_tok = torch.where(ADV < 0, torch.minimum(l1, -3.0 * ADV), l1)
    verl = (verl_tok * MASK).sum() / MASK.sum()
    ours = aggregate_loss(per_token, MASK, "token-mean")
    torch.testing.assert_close(ours, verl, **TOL)
    _, plain = _loss("ppo_clip")
    assert not torch.isclose(aggregate_loss(plain, MASK, "token-mean"), verl)


def test_trl_compute_loss_loss_type_grpo_and_dr_grpo():
    """TRL f2cd577, `trl/trainer/grpo_trainer.py` `GRPOTrainer._compute_loss` reductions: `"grpo"` = `((l m).sum(-1) /
    m.sum(-1).clamp(min=1)).mean()` over all rows; `"dr_grpo"` = `(l m).sum() / (B *
    max_completion_length)`. Harness: `loss_agg=seq-mean-token-mean loss_agg.count_masked_rows=true`
    and `loss_agg=seq-mean-token-sum-norm loss_agg.count_masked_rows=true` (constant = max_new_tokens)."""
    _, per_token = _loss("ppo_clip")
    torch.testing.assert_close(aggregate_loss(per_token, MASK, "seq-mean-token-mean", count_masked_rows=True),
                               _seq_token_mean_all_rows(per_token), **TOL)
    max_completion_length = 7
    dr = (per_token * MASK).sum() / (4 * max_completion_length)
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-sum-norm", count_masked_rows=True,
                          max_len=max_completion_length)
    torch.testing.assert_close(ours, dr, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "seq-mean-token-sum-norm",
                                            max_len=max_completion_length), dr)


def test_verl_agg_loss_seq_mean_token_sum_norm():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py` `agg_loss`, `"seq-mean-token-sum-norm"`: `sum(seq_losses) /
    loss_scale_factor`, no division by the number of rows. Harness:
    `loss_agg=seq-mean-token-sum-norm loss_agg.divide_by_seqs=false loss_agg.constant=<factor>`."""
    _, per_token = _loss("ppo_clip")
    verl = (per_token * MASK).sum(-1).sum() / 6.0
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-sum-norm", constant=6.0, divide_by_seqs=False)
    torch.testing.assert_close(ours, verl, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "seq-mean-token-sum-norm", constant=6.0), verl)


def test_trl_compute_loss_loss_type_cispo():
    """TRL f2cd577, `trl/trainer/grpo_trainer.py` `GRPOTrainer._compute_loss`, `loss_type="cispo"`:
    `-clamp(r, max=epsilon_high).detach() * A * log pi`, summed over the tokens / their count
    (`num_items_in_batch`). TRL's `epsilon_high` is the cap itself (5.0 recommended). Harness:
    `policy_loss=cispo policy_loss.epsilon_high=<TRL epsilon_high - 1>` (no lower bound, as TRL),
    `loss_agg=token-mean`; the gradient is checked too."""
    cap = 1.5
    logp, per_token = _loss("cispo", epsilon_high=cap - 1.0)
    ours = aggregate_loss(per_token, MASK, "token-mean")
    ours.backward()
    logp_trl = (LOG_RATIO - 1.0).clone().requires_grad_()
    r = (logp_trl - (LOG_RATIO - 1.0 - LOG_RATIO)).exp()
    trl = (-r.clamp(max=cap).detach() * ADV * logp_trl * MASK).sum() / MASK.sum()
    trl.backward()
    torch.testing.assert_close(ours, trl, **TOL)
    torch.testing.assert_close(logp.grad, logp_trl.grad, **TOL)
    _, default = _loss("cispo")
    assert not torch.isclose(aggregate_loss(default, MASK, "token-mean"), trl)


def test_verl_compute_policy_loss_cispo():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py`
    `compute_policy_loss_cispo`: `-clamp(r, 1 - clip_ratio_low, 1 + clip_ratio_high)
    .detach() * A * log pi` (log-ratio bounded to +-20), aggregated by `agg_loss`. Harness:
    `policy_loss=cispo policy_loss.epsilon_low=<clip_ratio_low> policy_loss.epsilon_high=<clip_ratio_high>`
    (the default has no lower bound, as the paper); gradients checked too."""
    low, high = 0.5, 0.28  # ratios 0.41, 0.46 below the band, 0.53, 0.76 inside, 1.43-2.46 above
    logp, per_token = _loss("cispo", epsilon_low=low, epsilon_high=high)
    ours = aggregate_loss(per_token, MASK, "token-mean")
    ours.backward()
    logp_v = (LOG_RATIO - 1.0).clone().requires_grad_()
    r = (logp_v + 1.0).clamp(-20, 20).exp()
    verl = (-r.clamp(1 - low, 1 + high).detach() * ADV * logp_v * MASK).sum() / MASK.sum()
    verl.backward()
    torch.testing.assert_close(ours, verl, **TOL)
    torch.testing.assert_close(logp.grad, logp_v.grad, **TOL)
    _, no_low = _loss("cispo", epsilon_high=high)
    assert not torch.isclose(aggregate_loss(no_low, MASK, "token-mean"), verl)


def test_openrlhf_policy_loss_gspo():
    """OpenRLHF 3c3be62, `openrlhf/models/loss.py` `PolicyLoss`, `policy_loss_type="gspo"`: the sequence
    ratio `exp(sum_t m log r / L)` at every token, `-min(s A, clamp(s, 1 - eps, 1 + eps_high) A)`,
    and `token_level_loss` forced off (`aggregate_loss`: each row's token mean, fully masked rows
    excluded). Harness: `policy_loss=gspo policy_loss.epsilon=<eps> policy_loss.epsilon_high=<eps_high>
    loss_agg=seq-mean-token-mean`."""
    eps, eps_high = 0.2, 0.28
    _, per_token = _loss("gspo", epsilon=eps, epsilon_high=eps_high)
    s = ((LOG_RATIO * MASK).sum(-1) / MASK.sum(-1).clamp(min=1)).exp()[:, None] * MASK
    tok = -torch.minimum(s * ADV, s.clamp(1 - eps, 1 + eps_high) * ADV)
    L = MASK.sum(-1)
    seq = (tok * MASK).sum(-1) / L.clamp(min=1)
    openrlhf = seq[L > 0].mean()
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-mean")
    torch.testing.assert_close(ours, openrlhf, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "token-mean"), openrlhf)


# ----------------------------------------------------------------- KL estimators


LOGP_KL = torch.tensor([[-1.0, -0.2, -3.0, -0.5, -25.0]], dtype=F64)
REF_KL = torch.tensor([[-1.5, -0.2, -0.1, -30.0, -0.4]], dtype=F64)  # k3 > 10 and a log-ratio < -20


def test_verl_kl_penalty_forward_low_var_kl():
    """verl b178a3c, `verl/trainer/ppo/core_algos.py`
    `kl_penalty_forward`, `"low_var_kl"`: `kl = clamp(ref - logp, -20, 20)`,
    `clamp(exp(kl) - kl - 1, -10, 10)`. Harness: `kl.form=k3 kl.clamp=10`."""
    x = (REF_KL - LOGP_KL).clamp(-20, 20)
    verl = (x.exp() - x - 1).clamp(-10, 10)
    torch.testing.assert_close(kl_penalty(LOGP_KL, REF_KL, "k3", clamp=10.0), verl, **TOL)
    assert not torch.allclose(kl_penalty(LOGP_KL, REF_KL, "k3"), verl)


def test_openrlhf_compute_approx_kl_k3():
    """OpenRLHF 3c3be62, `openrlhf/models/utils.py` `compute_approx_kl`, `kl_estimator="k3"`:
    `lr = logp - ref`, `exp(-lr) - 1 + lr`, clamped to [-10, 10] (every estimator is). Harness:
    `kl.form=k3 kl.clamp=10` (k1, k2 likewise with `kl.clamp=10`)."""
    lr = LOGP_KL - REF_KL
    openrlhf = ((-lr).exp() - 1 + lr).clamp(-10, 10)
    torch.testing.assert_close(kl_penalty(LOGP_KL, REF_KL, "k3", clamp=10.0), openrlhf, **TOL)
    torch.testing.assert_close(kl_penalty(LOGP_KL, REF_KL, "k1", clamp=10.0), lr.clamp(-10, 10), **TOL)
    torch.testing.assert_close(kl_penalty(LOGP_KL, REF_KL, "k2", clamp=10.0), (lr.square() / 2).clamp(-10, 10),
                               **TOL)
    assert not torch.allclose(kl_penalty(LOGP_KL, REF_KL, "k1"), lr.clamp(-10, 10))


# ----------------------------------------------------------------- rollout corrections


SAMPLER_LOG_RATIO = torch.tensor([[0.3, -0.2, 1.6, 0.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0],
                                  [0.0, 0.0, 0.0, 0.0, 0.0], [-0.4, 0.1, 0.2, -19.0, 0.05]], dtype=F64)


def test_verl_compute_rollout_correction_weights_token_and_sequence():
    """verl b178a3c, `verl/trainer/ppo/rollout_corr_helper.py` `compute_rollout_correction_weights`
    (`rollout_is="token"` / `"sequence"`, `rollout_is_batch_normalize=False`): `exp` of the token
    log-ratio (or of its masked sum over the row), bounded to [-20, 20] first, then
    `clamp(max=rollout_is_threshold)` (default 2.0). Harness: `rollout_correction=token_truncate`
    / `sequence_truncate` with `rollout_correction.cap=2` (log-ratios inside [-20, 20])."""
    lr = SAMPLER_LOG_RATIO
    token = lr.clamp(-20, 20).exp().clamp(max=2.0) * MASK
    seq = (lr * MASK).sum(-1, keepdim=True).clamp(-20, 20).exp().clamp(max=2.0).expand_as(lr) * MASK
    for name, verl in (("token_truncate", token), ("sequence_truncate", seq)):
        spec = ROLLOUT_CORRECTIONS.spec(name)
        torch.testing.assert_close(spec.fn(lr, MASK, spec.build(cap=2.0)), verl, **TOL)
        assert not torch.allclose(spec.fn(lr, MASK, spec.build()), verl)  # the default cap is 3


def test_trl_grpo_trainer_get_off_policy_mask():
    """TRL f2cd577, `trl/trainer/grpo_trainer.py`
    `GRPOTrainer.get_off_policy_mask`: keep a sequence where `A >= 0` or its mean over valid
    tokens of `log pi_sampler - log pi_theta` is `<= off_policy_mask_threshold`, drop it otherwise.
    Harness: `rollout_correction=off_policy_sequence_mask rollout_correction.threshold=<threshold>`."""
    threshold = 0.45
    current = -SAMPLER_LOG_RATIO  # log pi_theta - log pi_sampler
    adv = torch.tensor([-1.0, -0.5, -2.0, 0.0], dtype=F64)
    kl = ((-current) * MASK).sum(1, keepdim=True) / MASK.sum(1, keepdim=True).clamp(min=1.0)
    trl = ((adv[:, None] >= 0) | (kl <= threshold)).to(F64) * MASK
    spec = ROLLOUT_CORRECTIONS.spec("off_policy_sequence_mask")
    ours = spec.fn(torch.zeros_like(current), MASK, spec.build(threshold=threshold), advantages=adv,
                   current_log_ratio=current * MASK)
    torch.testing.assert_close(ours, trl, **TOL)
    # rows 0 and 1 (mean divergence 0.57 and 0.5, A < 0) are dropped; the default 0.5 keeps row 1
    assert ours.sum(1).tolist() == [0.0, 0.0, 0.0, 5.0]
    default = spec.fn(torch.zeros_like(current), MASK, spec.build(), advantages=adv, current_log_ratio=current * MASK)
    assert default.sum(1).tolist() == [0.0, 1.0, 0.0, 5.0]


# ----------------------------------------------------------------- NeMo-RL KL and aggregation


def _nemo_rl_calculate_kl(logp: torch.Tensor, ref: torch.Tensor, kl_type: str) -> torch.Tensor:
    """NeMo-RL `nemo_rl/algorithms/utils.py` `calculate_kl` at 7ea279a, with its defaults
    (`kl_input_clamp_value` 20, `kl_output_clamp_value` 10) and the weights `ClippedPGLossFn`
    passes when `use_on_policy_kl_approximation=false` (the default): `w = exp(logp - sg(logp))`
    (value 1), detached where the input clamp acts. `logr = clamp(ref - logp, -20, 20)`;
    k1 `-logr`, k2 `logr^2 / 2`, k3 `exp(logr) - 1 - logr`; `clamp(w k, -10, 10)`."""
    logr_raw = ref - logp
    logr = logr_raw.clamp(-20.0, 20.0)
    w = torch.exp(logp - logp.detach())
    w = torch.where(logr_raw == logr, w, w.detach())
    k = {"k1": -logr, "k2": logr.square() / 2, "k3": torch.exp(logr) - 1 - logr}[kl_type]
    return (w * k).clamp(-10.0, 10.0)


# row 0: log-ratios ref - logp of -0.5, 0, 2.9 (k3 14.3, past the output clamp), -29.5 (past the
# input clamp) and 24.6; row 1: two valid tokens, then masked ones holding log-ratios past both.
LOGP_NR = torch.tensor([[-1.0, -0.2, -3.0, -0.5, -25.0], [-0.7, -2.0, -40.0, -0.1, -0.3]], dtype=F64)
REF_NR = torch.tensor([[-1.5, -0.2, -0.1, -30.0, -0.4], [-0.9, -1.2, -0.2, -35.0, -0.3]], dtype=F64)
MASK_NR = torch.tensor([[1.0, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=F64)


def test_nemo_rl_calculate_kl_k1_k2_k3():
    """NeMo-RL `nemo_rl/algorithms/utils.py` `calculate_kl` (7ea279a), reduced by
    `nemo_rl/algorithms/loss/loss_functions.py` `ClippedPGLossFn.__call__` with
    `token_level_loss=true`: `masked_mean(beta kl, mask, global_valid_toks)` (its `+ 1e-8` in the
    denominator, a relative 1e-9 here, left out). Values: harness `kl.form=<k1|k2|k3>
    kl.clamp=10` on every token, masked tokens 0. Gradients: NeMo-RL's weight `exp(logp - sg(logp))`
    adds the score-function term `k d logp`, which the harness gives with
    `kl.importance_correct=true` at `old = logp` (mu = 1) for k1 and k3 (k2 has no importance-corrected
    form here: its gradient differs where 0 < k2 <= 10, no knob; past the clamp both are 0); on a token
    past the output clamp NeMo-RL's gradient is 0 (it clamps `w k`), ours `10 d logp` (we clamp `k`,
    then weight)."""
    beta = 0.01
    n_tok = MASK_NR.sum()
    for form in ("k1", "k2", "k3"):
        logp_n = LOGP_NR.clone().requires_grad_()
        nemo_tok = _nemo_rl_calculate_kl(logp_n, REF_NR, form)
        nemo = (beta * nemo_tok * MASK_NR).sum() / n_tok
        nemo.backward()
        logp_h = LOGP_NR.clone().requires_grad_()
        ours_tok = kl_penalty(logp_h, REF_NR, form, clamp=10.0, mask=MASK_NR)
        torch.testing.assert_close(ours_tok, nemo_tok.detach() * MASK_NR, **TOL)
        ours = aggregate_loss(beta * ours_tok, MASK_NR, "token-mean")
        torch.testing.assert_close(ours.detach(), nemo.detach(), **TOL)
        # the clamp is on: without it the harness differs on the tokens past +-10
        assert not torch.allclose(kl_penalty(LOGP_NR, REF_NR, form, mask=MASK_NR), nemo_tok.detach() * MASK_NR)
        # the plain estimator lacks the score-function term k d logp where k != 0
        ours.backward()
        moving = (nemo_tok.detach().abs() < 10) & (MASK_NR > 0) & (nemo_tok.detach() != 0)
        assert moving.any() and not torch.allclose(logp_h.grad[moving], logp_n.grad[moving])
        if form == "k2":  # no importance-corrected k2 in the harness (biased in value): no knob
            past = (nemo_tok.detach().abs() >= 10) & (MASK_NR > 0)  # past the clamp: both gradients 0
            assert past.any() and (logp_n.grad[past] == 0).all() and (logp_h.grad[past] == 0).all()
            continue
        # gradients: importance-corrected at old = logp equals NeMo-RL where |k| < 10 ...
        logp_ic = LOGP_NR.clone().requires_grad_()
        ic = kl_penalty(logp_ic, REF_NR, form, clamp=10.0, mask=MASK_NR, old_logprobs=LOGP_NR.clone())
        aggregate_loss(beta * ic, MASK_NR, "token-mean").backward()
        inside = (nemo_tok.detach().abs() < 10) & (MASK_NR > 0)
        torch.testing.assert_close(logp_ic.grad[inside], logp_n.grad[inside], **TOL)
        # ... and differs past the clamp (NeMo-RL 0, ours 10 beta / N)
        past = (nemo_tok.detach().abs() >= 10) & (MASK_NR > 0)
        assert past.any() and (logp_n.grad[past] == 0).all()
        torch.testing.assert_close(logp_ic.grad[past].abs(), torch.full_like(logp_ic.grad[past], 10 * beta / n_tok),
                                   **TOL)
        assert inside.sum() >= 3


def test_nemo_rl_clipped_pg_loss_fn_sequence_level_loss():
    """NeMo-RL `nemo_rl/algorithms/loss/loss_functions.py` `ClippedPGLossFn.__call__` (7ea279a),
    `token_level_loss=false`: `masked_mean(masked_mean(l, token_mask, dim=-1), sample_mask,
    global_valid_seqs)` with `global_valid_seqs = sum(sample_mask)`
    (`nemo_rl/models/automodel/data.py`); its `+ 1e-8` in both denominators (a relative 1e-8 / L)
    left out. A row with no loss token but `sample_mask` 1 (an empty completion) adds 0 and counts:
    harness `loss_agg=seq-mean-token-mean loss_agg.count_masked_rows=true`. A row with
    `sample_mask` 0 (`overlong_filtering`) leaves NeMo-RL's count; that case differs (docs/knobs.md)."""
    _, per_token = _loss("ppo_clip")
    sample_mask = torch.ones(4, dtype=F64)  # row 2 (no token) is an empty completion
    L = MASK.sum(-1)
    rows = torch.where(L > 0, (per_token * MASK).sum(-1) / L.clamp(min=1), torch.zeros_like(L))
    nemo = (rows * sample_mask).sum() / sample_mask.sum()
    ours = aggregate_loss(per_token, MASK, "seq-mean-token-mean", count_masked_rows=True)
    torch.testing.assert_close(ours, nemo, **TOL)
    assert not torch.isclose(aggregate_loss(per_token, MASK, "seq-mean-token-mean"), nemo)
    # sample_mask 0 on row 2 (a filtered row): NeMo-RL counts 3 rows, as our default
    sm = torch.tensor([1.0, 1, 0, 1], dtype=F64)
    nemo_filtered = (rows * sm).sum() / sm.sum()
    torch.testing.assert_close(aggregate_loss(per_token, MASK, "seq-mean-token-mean"), nemo_filtered, **TOL)


def test_openrlhf_policy_loss_vllm_is_correction_tis():
    """OpenRLHF 3c3be62, `openrlhf/models/loss.py` `PolicyLoss.forward`, `policy_loss_type="ppo"`,
    `vllm_is_correction_type="tis"`: `vllm_is = exp(old - rollout).clamp(min=low_threshold,
    max=high_threshold).detach()`, `loss = vllm_is * (-min(r A, clip(r, 1 - eps, 1 + eps) A))`,
    `aggregate_loss` token-level. With `low_threshold <= 0` (no lower bound: the weight is > 0)
    it is harness `rollout_correction=token_truncate rollout_correction.cap=<high_threshold>`
    `loss_agg=token-mean`; a `low_threshold` > 0 lifts tokens with `rho < low_threshold`, which no
    knob of ours does (the row's "differs", checked here)."""
    high = 2.0
    lr = SAMPLER_LOG_RATIO
    spec = ROLLOUT_CORRECTIONS.spec("token_truncate")
    w = spec.fn(lr, MASK, spec.build(cap=high))
    ppo_clip = POLICY_LOSSES.spec("ppo_clip")
    old = torch.full_like(LOG_RATIO, -1.0)  # logp - old = LOG_RATIO
    per_token, _ = ppo_clip.fn(LOG_RATIO - 1.0, old, ADV, MASK, ppo_clip.build(), weights=w)
    unweighted, _ = ppo_clip.fn(LOG_RATIO - 1.0, old, ADV, MASK, ppo_clip.build())
    ours = aggregate_loss(per_token, MASK, "token-mean")
    r = LOG_RATIO.clamp(-20, 20).exp()
    ppo = -torch.minimum(r * ADV, r.clamp(0.8, 1.2) * ADV)

    def openrlhf(low):
        vllm_is = lr.exp().clamp(min=low, max=high)
        return (vllm_is * ppo * MASK).sum() / MASK.sum()

    torch.testing.assert_close(ours, openrlhf(0.0), **TOL)
    torch.testing.assert_close(w, lr.exp().clamp(max=high) * MASK, **TOL)
    assert not torch.isclose(aggregate_loss(unweighted, MASK, "token-mean"), openrlhf(0.0))
    assert not torch.isclose(ours, openrlhf(0.9))  # a lower bound (rho = e^-0.4 < 0.9 on row 3) differs


def test_verl_compute_rollout_rejection_mask_seq_mean_k1():
    """verl b178a3c, `verl/trainer/ppo/rollout_corr_helper.py` `compute_rollout_rejection_mask`,
    `rollout_rs="seq_mean_k1"`, `rollout_rs_threshold="<lower>_<upper>"`: `k1 = -clamp(log_ratio,
    -20, 20)` (`log_ratio = log pi_train - log pi_rollout`), a sequence kept where
    `log(lower) <= mean_t k1 <= log(upper)`, i.e. `1/upper <= rho_geo <= 1/lower`. Harness:
    `rollout_correction=geometric rollout_correction.lower=<1/upper> rollout_correction.upper=<1/lower>`
    (the keep set only: verl then drops the rejected rows from the denominator, ours keeps them at
    weight 0, the row's "differs"). An asymmetric band separates the two readings."""
    lo, up = 0.9, 1.6
    lr = SAMPLER_LOG_RATIO.clone()
    lr[0, :3] = torch.tensor([0.5, 0.1, 0.3], dtype=F64)  # mean 0.3: inside [lo, up], outside verl's band
    lr[1, 0] = -0.3  # inside verl's band [1/up, 1/lo], outside [lo, up]
    k1 = -lr.clamp(-20, 20)
    mean_k1 = (k1 * MASK).sum(-1) / MASK.sum(-1).clamp(min=1)
    verl = ((mean_k1 >= math.log(lo)) & (mean_k1 <= math.log(up))).to(F64)[:, None] * MASK
    spec = ROLLOUT_CORRECTIONS.spec("geometric")
    ours = spec.fn(lr, MASK, spec.build(lower=1 / up, upper=1 / lo))
    torch.testing.assert_close(ours, verl, **TOL)
    assert not torch.equal(spec.fn(lr, MASK, spec.build(lower=lo, upper=up)), verl)
