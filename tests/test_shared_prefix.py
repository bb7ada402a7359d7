"""Shared-prefix forward: each group's prompt runs once, results equal the full forward.

The equalities run in float64 to 1e-10 (the two paths sum in different orders: ~1e-16 relative
apart in double, while a wrong cache, position or mask is off by far more) and in float32 against
its rounding noise (the tolerances below, ~100x float32's 1e-7 for a 2-layer forward/backward).
"""

import pytest
import torch

from harness.algo import build_algorithm
from harness.train.critic import ValueModel
from harness.model.kv import prompt_groups
from harness.model.logprobs import token_logprobs
from harness.train.update import TrainBatch, batched_logprobs, length_order, padding_waste, policy_pass
from tests.conftest import compose, tiny_llama


def _grouped(tokenizer, U=3, G=4, Tp=9, Tc=6, seed=1):
    """U distinct left-padded prompts, each repeated G times, rows shuffled; ragged completions."""
    g = torch.Generator().manual_seed(seed)
    up = torch.randint(3, 1000, (U, Tp), generator=g)
    um = torch.ones(U, Tp, dtype=torch.long)
    um[0, :3] = 0
    up[0, :3] = tokenizer.pad_token_id
    um[2, :1] = 0
    up[2, :1] = tokenizer.pad_token_id
    perm = torch.randperm(U * G, generator=g)
    p_ids, p_mask = up.repeat_interleave(G, 0)[perm], um.repeat_interleave(G, 0)[perm]
    c_ids = torch.randint(3, 1000, (U * G, Tc), generator=g)
    c_mask = torch.ones_like(c_ids)
    c_mask[1, 3:] = 0
    c_mask[min(5, U * G - 1), 1:] = 0
    c_ids[c_mask == 0] = tokenizer.pad_token_id
    return p_ids, p_mask, c_ids, c_mask, perm // G  # last: the true prompt index of each row


F64 = dict(atol=1e-12, rtol=1e-10)


def _dtypes(atol, rtol):
    """float64 to 1e-10 and float32 to (``atol``, ``rtol``), as pytest parameters."""
    return pytest.mark.parametrize("dtype,tol", [pytest.param(torch.float64, F64, id="float64"),
                                                 pytest.param(torch.float32, dict(atol=atol, rtol=rtol), id="float32",
                                                              marks=pytest.mark.exactness)])


def _grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def test_prompt_groups_finds_repeated_prompts(tokenizer):
    p_ids, p_mask, _, _, true = _grouped(tokenizer)
    first, inverse = prompt_groups(p_ids, p_mask)
    assert len(first) == 3
    torch.testing.assert_close(p_ids[first][inverse], p_ids)
    # same partition as the true prompt index, whatever the labels
    assert all((inverse == inverse[i]).equal(true == true[i]) for i in range(len(true)))
    assert (first == torch.tensor([int((inverse == u).nonzero()[0]) for u in range(3)])).all()
    # same tokens but a different mask is a different prompt (the pad id can be a real token id)
    m2 = p_mask.clone()
    m2[first[1], 0] = 1 - m2[first[1], 0]
    assert len(prompt_groups(p_ids, m2)[0]) == 4


@_dtypes(atol=2e-5, rtol=1e-4)
def test_shared_prefix_logprobs_and_gradients_match_full_forward(tokenizer, dtype, tol):
    p_ids, p_mask, c_ids, c_mask, _ = _grouped(tokenizer)
    model = tiny_llama(tokenizer, dtype=dtype)
    out = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        lp, ent = token_logprobs(model, p_ids, p_mask, c_ids, c_mask, with_entropy=True, share_prefix=share)
        ((lp * c_mask).sum() + 0.1 * (ent * c_mask).sum()).backward()
        out[share] = (lp.detach() * c_mask, ent.detach() * c_mask, _grads(model))
    for a, b in zip(out[False], out[True]):
        assert a.dtype == dtype
        torch.testing.assert_close(a, b, **tol)
    assert out[True][2].abs().sum() > 0


@_dtypes(atol=1e-6, rtol=1e-4)
def test_policy_pass_gradient_same_with_and_without_sharing(tokenizer, dtype, tol):
    p_ids, p_mask, c_ids, c_mask, true = _grouped(tokenizer)
    adv = torch.randn(len(true), generator=torch.Generator().manual_seed(2))[:, None].expand_as(c_mask) * c_mask
    grads = []
    for share in (False, True):
        model = tiny_llama(tokenizer, dtype=dtype)
        s = build_algorithm(compose("policy_loss.epsilon=0.2", "beta=0.0", "entropy_coef=0.01",
                                    "loss_agg=seq-mean-token-mean", "rollout.temperature=0.7", "train.logprob_chunk=4",
                                    f"train.share_prefix={share}"))
        stats = policy_pass(model, TrainBatch(p_ids, p_mask, c_ids, c_mask, adv), s, micro_batch_size=4)
        grads.append(_grads(model))
        assert abs(stats["ratio_mean"] - 1.0) < 1e-6  # on-policy
    assert grads[0].dtype == dtype
    torch.testing.assert_close(grads[0], grads[1], **tol)


@_dtypes(atol=2e-5, rtol=1e-4)
def test_batched_logprobs_and_values_shared_match_unshared(tokenizer, dtype, tol):
    p_ids, p_mask, c_ids, c_mask, _ = _grouped(tokenizer)
    model = tiny_llama(tokenizer, dtype=dtype)
    kw = dict(temperature=1.0, chunk=4, micro_batch_size=4)
    a = batched_logprobs(model, p_ids, p_mask, c_ids, c_mask, **kw)
    b = batched_logprobs(model, p_ids, p_mask, c_ids, c_mask, share_prefix=True, **kw)
    assert a.dtype == dtype
    torch.testing.assert_close(a * c_mask, b * c_mask, **tol)
    critic = ValueModel(tiny_llama(tokenizer, dtype=dtype))
    torch.nn.init.normal_(critic.value_head.weight)
    v0 = critic(p_ids, p_mask, c_ids, c_mask)
    critic.share_prefix = True
    v1 = critic(p_ids, p_mask, c_ids, c_mask)
    assert v0.dtype == dtype
    torch.testing.assert_close(v0 * c_mask, v1 * c_mask, **tol)


def test_group_order_keeps_prompts_together_and_waste_counts_each_prompt_once(tokenizer):
    p_ids, p_mask, c_ids, c_mask, _ = _grouped(tokenizer)
    _, inverse = prompt_groups(p_ids, p_mask)
    order = length_order(p_mask, c_mask, inverse)
    runs = inverse[order]
    assert (runs[1:] != runs[:-1]).sum() == 2  # 3 prompts -> 3 contiguous runs
    assert p_mask[order].sum(1).tolist() == sorted(p_mask.sum(1).tolist(), reverse=True)
    # The data: prompts of 9, 8, 6 real tokens (9 columns); completion lengths per group
    # {6, 1, 6, 6}, {6, 3, 6, 6}, {6, 6, 6, 6}. Hand count, micro-batches of 4 = one prompt each:
    # shared:   9 + 4*6 = 33 slots / 9 + 19 = 28 real; 8 + 24 = 32 / 8 + 21 = 29; 6 + 24 = 30 / 30
    assert abs(padding_waste(p_mask, c_mask, 4, p_ids) - 8 / 95) < 1e-9
    # unshared: every row pays for its prompt: 4*15 = 60 / 36 + 19; 4*14 = 56 / 32 + 21; 4*12 = 48 / 48
    assert abs(padding_waste(p_mask, c_mask, 4) - 8 / 164) < 1e-9


def test_no_repeats_falls_back_to_plain_forward(tokenizer, monkeypatch):
    import harness.model.logprobs as lp

    p_ids, p_mask, c_ids, c_mask, _ = _grouped(tokenizer, U=4, G=1)
    called = []
    monkeypatch.setattr(lp, "shared_prefix_hidden", lambda *a, **k: called.append(1))
    model = tiny_llama(tokenizer)
    token_logprobs(model, p_ids, p_mask, c_ids, c_mask, share_prefix=True)
    assert not called


@pytest.mark.parametrize("dtype,rel,abs_", [pytest.param("float64", 1e-10, 1e-12, id="float64"),
                                            pytest.param("float32", 1e-3, 1e-5, id="float32", marks=pytest.mark.exactness)])
def test_trainer_metrics_match_with_and_without_share_prefix(run_dir, monkeypatch, dtype, rel, abs_):
    """Same seed, same rollout: the step's losses, KL and values agree whether prompts are shared.
    float64 to 1e-10; float32 to 1e-3, step 2 coming after an AdamW step that turns float32
    rounding of near-zero gradients into lr-sized steps (tests/knob_probe.adamw_noise_ok)."""
    import harness.model.logprobs as lp
    from tests.conftest import run_job

    calls = []
    real = lp.shared_prefix_hidden
    monkeypatch.setattr(lp, "shared_prefix_hidden", lambda *a: calls.append(1) or real(*a))
    keys = ["train/loss", "train/kl", "train/value_loss", "train/clip_frac", "train/grad_norm"]
    got = {}
    for share in (False, True):
        _, _, history = run_job(f"train.share_prefix={share}", "advantage=ppo", "beta=0.04", "mu=2",
                                "train.lr=1e-3", "eval.every=0", f"model.dtype={dtype}")
        assert bool(calls) == share  # the flag reaches the training forwards
        got[share] = {k: [v for _, v in history(k)] for k in keys}
        waste = [v for _, v in history("perf/padding_waste")]
        assert len(waste) == 2 and all(0.0 <= v < 1.0 for v in waste)
    for k in keys:
        assert len(got[True][k]) == 2, k
        assert got[True][k] == pytest.approx(got[False][k], rel=rel, abs=abs_), k


def test_rollout_shared_prefill_same_greedy_completions_and_prefills_once(tokenizer):
    """The hf backend prefills each distinct prompt once; greedy output is unchanged."""
    from harness.rollout import SamplingParams
    from harness.rollout import build_backend

    model = tiny_llama(tokenizer, initializer_range=0.5)  # large weights: varied greedy tokens
    prompts = ["What is 2+3? Answer:", "Compute 17 times 3, please. Answer:", "Hi"]
    widths = []
    hook = model.model.register_forward_pre_hook(lambda mod, args, kw: widths.append(kw["input_ids"].shape),
                                                 with_kwargs=True)
    out = {}
    for share in (False, True):
        widths.clear()
        out[share] = build_backend("hf", model, tokenizer, progress=False, share_prefix=share).generate(
            prompts, 4, SamplingParams(0.0, 1.0, 12))
        out[share, "first"] = widths[0]
    hook.remove()
    assert torch.equal(out[False].completion_ids, out[True].completion_ids)
    assert torch.equal(out[False].completion_mask, out[True].completion_mask)
    assert len(set(map(tuple, out[True].completion_ids[::4, :6].tolist()))) > 1  # not one constant token
    tp = out[True].prompt_ids.shape[1]
    assert tuple(out[False, "first"]) == (12, tp)  # every row prefilled
    assert tuple(out[True, "first"]) == (3, tp - 1)  # 3 distinct prompts, all but the last token
