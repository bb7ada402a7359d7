"""The optimisation pass: on-policy ratio, clipping with mu > 1, micro-batch invariance.

The micro-batching equalities run twice: in float64 to 1e-10 (a different summation order moves
a float64 gradient by ~1e-16 relative, a real difference by far more), and in float32 against
float32 rounding noise (~1e-7 per operation, summed over the batch's tokens).
"""

import pytest
import torch

from harness.algo import build_algorithm
from harness.train.update import TrainBatch, batched_logprobs, policy_pass
from tests.conftest import compose, tiny_llama


def _batch(tokenizer, B=6, Tp=5, Tc=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 1000, (B, Tp), generator=g)
    prompt_mask = torch.ones(B, Tp, dtype=torch.long)
    prompt_mask[0, :2] = 0  # one left-padded row
    prompt_ids[0, :2] = tokenizer.pad_token_id
    completion_ids = torch.randint(3, 1000, (B, Tc), generator=g)
    mask = torch.ones(B, Tc, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 1:] = 0
    adv = torch.randn(B, 1, generator=g).expand(B, Tc) * mask
    return TrainBatch(prompt_ids, prompt_mask, completion_ids, mask, adv)


def _settings(*overrides):
    """The algorithm the loss reads, built from a run config (there is no second copy of the settings)."""
    return build_algorithm(compose("policy_loss.epsilon=0.05", "beta=0.0", "train.logprob_chunk=4", "train.share_prefix=false",
                   "rollout.temperature=1.0", *overrides))


def test_mu1_ratio_exactly_one_and_mu2_clips(tokenizer):
    model = tiny_llama(tokenizer)
    batch = _batch(tokenizer)
    s = _settings()
    stats = policy_pass(model, batch, s, micro_batch_size=4)  # old=None: on-policy
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0
    # mu = 2: old log-probs fixed from a separate forward; first pass exact, second clips
    batch.old_logprobs = batched_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                          batch.loss_mask, temperature=1.0, chunk=4, micro_batch_size=4)
    opt = torch.optim.SGD(model.parameters(), lr=50.0)
    for epoch in range(2):
        opt.zero_grad()
        stats = policy_pass(model, batch, s, micro_batch_size=4)
        if epoch == 0:
            assert stats["clip_frac"] == 0.0
            assert abs(stats["ratio_mean"] - 1.0) < 1e-6
        opt.step()
    assert stats["clip_frac"] > 0.0


# (dtype, tolerance): float64 exact up to rounding; float32 within its rounding noise
DTYPES = [pytest.param(torch.float64, dict(atol=1e-12, rtol=1e-10), id="float64"),
          pytest.param(torch.float32, dict(atol=1e-6, rtol=1e-4), id="float32", marks=pytest.mark.exactness)]


@pytest.mark.parametrize("dtype,tol", DTYPES)
def test_gradient_invariant_to_micro_batch_size(tokenizer, dtype, tol):
    """Accumulating over micro-batches of 1, 2, 6 rows gives the full-batch gradient."""
    grads = []
    for mbs in (6, 2, 1):
        for agg in ("token-mean", "seq-mean-token-mean"):
            model = tiny_llama(tokenizer, dtype=dtype)
            policy_pass(model, _batch(tokenizer), _settings(f"loss_agg={agg}"), micro_batch_size=mbs)
            grads.append((agg, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    for agg in ("token-mean", "seq-mean-token-mean"):
        g = [x for a, x in grads if a == agg]
        assert g[0].dtype == dtype and float(g[0].abs().max()) > 1e-3
        torch.testing.assert_close(g[0], g[1], **tol)
        torch.testing.assert_close(g[0], g[2], **tol)


@pytest.mark.parametrize("dtype,tol", [pytest.param(torch.float64, dict(atol=1e-12, rtol=1e-10), id="float64"),
                                       pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="float32",
                                                    marks=pytest.mark.exactness)])
def test_trimmed_sorted_micro_batches_match_one_untrimmed_batch(tokenizer, dtype, tol):
    """Length-sorted, padding-trimmed micro-batches give the same log-probs."""
    from harness.model.logprobs import token_logprobs
    from harness.train.update import batched_logprobs, padding_waste

    batch = _batch(tokenizer)
    batch.completion_ids[:, 5:] = tokenizer.pad_token_id
    batch.loss_mask[:, 5:] = 0  # trailing pad columns no row needs
    model = tiny_llama(tokenizer, dtype=dtype)
    full, _ = token_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.loss_mask)
    ours = batched_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.loss_mask,
                            temperature=1.0, chunk=4, micro_batch_size=2)
    m = batch.loss_mask.bool()
    assert ours.dtype == full.dtype == dtype
    torch.testing.assert_close(ours[m], full[m], **tol)
    assert (ours[:, 5:] == 0).all()  # trimmed columns come back as zeros
    # hand count, micro-batches of 2 after sorting: [r3,r4] 20 slots/20 real, [r5,r1] 20/19, [r2,r0] 20/14
    assert abs(padding_waste(batch.prompt_mask, batch.loss_mask, 2) - 7 / 60) < 1e-9
    # hand count: micro-batches of the whole batch (size 6) keep 5 prompt + 5 completion columns
    real = int(batch.prompt_mask.sum() + batch.loss_mask.sum())
    assert abs(padding_waste(batch.prompt_mask, batch.loss_mask, 6) - (1 - real / (6 * 10))) < 1e-9
