"""Top-k / top-p sampling (``rollout.top_k``, ``rollout.top_p``): the keep set by hand, the hf
sampler against the trainer's renormalised log-probs in float64, and TRL PR #7269's measurement
with the embedded model (without renormalisation the mean IS ratio is the kept mass; with it, 1).
The vLLM side is in tests/test_vllm.py."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import run_job, tiny_llama
from harness.model.logprobs import completion_hidden, token_logprobs
from harness.rollout import SamplingParams, build_backend
from harness.model.truncation import SamplingFilter, keep_set, truncate_logits

P4 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)


def test_top_p_keeps_the_smallest_head_reaching_p():
    # probs 0.5, 0.3, 0.15, 0.05; ascending cumulative 0.05, 0.20, 0.50, 1.0; top_p = 0.75 drops
    # c <= 0.25: the 0.05 and the 0.15 token; the kept head 0.5 + 0.3 = 0.8 >= 0.75
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64).log()
    assert keep_set(logits, top_p=0.75).tolist() == [True, True, False, False]
    # renormalised over the keep set: log(0.3 / 0.8)
    lp = torch.log_softmax(truncate_logits(logits, SamplingFilter(top_p=0.75)), -1)
    assert abs(float(lp[1]) - math.log(0.3 / 0.8)) < 1e-12 and lp[2] == float("-inf")
    # the most probable token always stays, however small p
    assert keep_set(logits, top_p=1e-6).tolist() == [True, False, False, False]
    assert keep_set(logits).all() and keep_set(logits, top_k=4).all()


def test_top_k_keeps_ties_with_the_kth_value():
    # k = 2: the 2nd largest value is 1.0 and two tokens have it: both kept (transformers and vLLM:
    # drop l < l_(k))
    assert keep_set(torch.tensor([2.0, 1.0, 1.0, 0.0]), top_k=2).tolist() == [True, True, True, False]
    assert keep_set(torch.tensor([2.0, 1.5, 1.0, 0.0]), top_k=2).tolist() == [True, True, False, False]


def test_top_p_applies_to_the_top_k_renormalised_distribution():
    # probs 0.4, 0.3, 0.2, 0.1; top_k = 3 keeps mass 0.9, renormalised 4/9, 3/9, 2/9; top_p = 0.75 on
    # that: ascending cumulative 2/9 = 0.222 <= 0.25 drops the 0.2 token -> keep {0, 1} (top-p on the
    # full distribution would need 0.4 + 0.3 + 0.2 = 0.9 >= 0.75 and keep three)
    logits = P4.log()
    assert keep_set(logits, top_k=3, top_p=0.75).tolist() == [True, True, False, False]
    assert keep_set(logits, top_p=0.75).tolist() == [True, True, True, False]
    lp = torch.log_softmax(truncate_logits(logits, SamplingFilter(3, 0.75)), -1)
    torch.testing.assert_close(lp[:2], torch.tensor([0.4 / 0.7, 0.3 / 0.7], dtype=torch.float64).log(),
                               rtol=0, atol=1e-12)


def test_temperature_comes_before_top_p():
    # at T = 0.5 the probs become p^2 / sum p^2 = (16, 9, 4, 1) / 30; top_p = 0.8 keeps 16/30 + 9/30 =
    # 0.833 (two tokens); at T = 1 it needs 0.4 + 0.3 + 0.2 (three)
    assert keep_set(P4.log() / 0.5, top_p=0.8).tolist() == [True, True, False, False]
    assert keep_set(P4.log(), top_p=0.8).tolist() == [True, True, True, False]


def test_tie_on_the_top_p_boundary_is_decided_by_the_stable_sort():
    # probs 0.5, 0.25, 0.25; top_p = 0.6: the head needs one of the two tied tokens; the stable
    # ascending sort drops the lower id first, so token 2 stays (docs: what happens at a tie)
    logits = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).log()
    assert keep_set(logits, top_p=0.6).tolist() == [True, False, True]


def test_bad_filter_values_are_refused():
    with pytest.raises(ValueError, match="top_p"):
        keep_set(P4, top_p=0.0)
    with pytest.raises(ValueError, match="top_k"):
        keep_set(P4, top_k=-1)


def test_sampled_token_is_kept_even_outside_the_recomputed_set():
    # token 3 is outside the top-2 set, but it was sampled: it stays, renormalised with the set
    lp = torch.log_softmax(truncate_logits(P4.log(), SamplingFilter(top_k=2), torch.tensor(3)), -1)
    torch.testing.assert_close(lp.exp(), torch.tensor([0.5, 0.375, 0.0, 0.125], dtype=torch.float64),
                               rtol=0, atol=1e-12)


def _logits(model, batch, temperature):
    """``[B, Tc, V]`` full-vocabulary logits / T of a plain forward (the keep sets recomputed apart
    from :func:`token_logprobs`)."""
    with torch.no_grad():
        hidden = completion_hidden(model, batch.prompt_ids, batch.prompt_mask, batch.completion_ids,
                                   batch.completion_mask)
        return model.get_output_embeddings()(hidden) / temperature


@pytest.mark.parametrize("seed", [3, None])
@pytest.mark.parametrize("top_k,top_p", [(0, 0.8), (20, 1.0), (50, 0.7)])
def test_hf_sampler_draws_from_the_trainers_keep_set(tokenizer, seed, top_k, top_p):
    """A float64 policy sampled by the hf backend (seeded race and transformers' sampler): every
    sampled token is inside the keep set recomputed from the trainer's own float64 logits, and the
    sampler's log-probs equal the trainer's renormalised ones up to ``generate``'s float32 (it
    rounds the logits to float32 and the recorder's log-softmax over 49k logits runs in float32:
    measured 1.1e-6; the bound 1e-5 is 4 orders below |log kept mass| >= 0.05, the bias the
    renormalisation removes; the float64 agreement is the next test); the full softmax is lower by
    exactly the log of the kept mass."""
    model = tiny_llama(tokenizer, seed=2, dtype=torch.float64)
    T, f = 0.9, SamplingFilter(top_k, top_p)
    batch = build_backend("hf", model, tokenizer, progress=False).generate(
        ["a b c", "the quick brown fox jumps"], 4,
        SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=12, seed=seed))
    m = batch.completion_mask.bool()
    logits = _logits(model, batch, T)
    kept = keep_set(logits, top_k, top_p)
    inside = kept.gather(-1, batch.completion_ids.unsqueeze(-1)).squeeze(-1)
    assert inside[m].all()
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    trainer = token_logprobs(model, *args, temperature=T, keep=f)[0].detach()
    assert float((batch.sampler_logprobs - trainer)[m].abs().max()) < 1e-5
    full = token_logprobs(model, *args, temperature=T)[0].detach()
    mass = (torch.softmax(logits, -1) * kept).sum(-1)
    assert float(mass[m].max()) < 0.95  # a real truncation: at least 5% of the mass dropped
    assert float((full - trainer - mass.log())[m].abs().max()) < 1e-10


@pytest.mark.parametrize("top_k,top_p", [(0, 0.8), (20, 1.0), (50, 0.7)])
def test_sampler_processor_and_trainer_agree_in_float64(tokenizer, top_k, top_p):
    """The hf sampler's processor (:class:`harness.rollout.hf._LogprobRecorder`: keep set, masking,
    recorded log-prob), fed the float64 logits of the trainer's forward step by step, records the
    trainer's renormalised log-probs to 1e-10, and the logits it hands to the sampler are -inf
    exactly outside the keep set; the entropy is that of the renormalised distribution."""
    from harness.rollout.hf import _LogprobRecorder

    model = tiny_llama(tokenizer, seed=2, dtype=torch.float64)
    T, f = 0.9, SamplingFilter(top_k, top_p)
    batch = build_backend("hf", model, tokenizer, progress=False).generate(
        ["a b c", "the quick brown fox jumps"], 3,
        SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=10, seed=5))
    raw = _logits(model, batch, 1.0)  # [B, Tc, V] float64, before temperature
    recorder, ids = _LogprobRecorder(T, f), batch.completion_ids
    for t in range(ids.shape[1]):
        handed = recorder(ids[:, :t] if t else ids[:, :1], raw[:, t])
        assert torch.equal(torch.isinf(handed), ~keep_set(raw[:, t] / T, top_k, top_p))
    sampler = recorder.finish(ids)
    m = batch.completion_mask.bool()
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    trainer, entropy = token_logprobs(model, *args, temperature=T, keep=f, with_entropy=True)
    assert sampler.dtype == torch.float64 and float((sampler - trainer.detach())[m].abs().max()) < 1e-10
    kept = keep_set(raw / T, top_k, top_p)
    q = torch.softmax((raw / T).masked_fill(~kept, float("-inf")), -1)
    by_hand = -(q * q.clamp_min(1e-300).log()).sum(-1)  # H of the renormalised distribution
    assert float((entropy.detach() - by_hand)[m].abs().max()) < 1e-10


def test_truncated_logprobs_have_finite_gradients(tokenizer):
    model = tiny_llama(tokenizer, seed=1, dtype=torch.float64)
    ids = torch.tensor([[5, 6, 7]])
    logp, ent = token_logprobs(model, ids, torch.ones_like(ids), ids, torch.ones_like(ids), temperature=0.7,
                               keep=SamplingFilter(10, 0.9), with_entropy=True)
    (logp.sum() + ent.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_a_truncated_run_scores_the_sampler_distribution(run_dir):
    """End to end (rollout=hf, top_p = 0.8, top_k = 50): the trainer's log-probs of the sampled
    tokens are the sampler's (the logged mismatch stays at float32 rounding, where the full softmax
    would be off by |log kept mass| ~ 0.2 for this tiny model), and the run trains."""
    _, run, history = run_job("rollout.top_p=0.8", "rollout.top_k=50")
    assert run.info.status == "FINISHED"
    assert run.data.params["rollout.top_p"] == "0.8" and run.data.params["rollout.top_k"] == "50"
    diffs = [v for _, v in history("rollout/logprob_diff_max")]
    assert len(diffs) == 2 and all(0 <= v < 1e-4 for v in diffs), diffs


def pr7269_measurement(model, tokenizer, backend, top_p=0.8, temperature=1.0, prompts=4, group=4, tokens=48):
    """TRL PR #7269's table row for ``top_p``: per token, the kept mass ``S`` (recomputed from the
    trainer's logits), the IS ratio ``exp(trainer - sampler)`` with full-softmax trainer log-probs
    and with log-probs renormalised over the keep set. Returns the means and the fractions outside
    [0.9, 1.1] (python floats) and the token count."""
    from harness.tasks import build_task
    from tests.conftest import compose

    task = build_task(compose("task=arith").task)
    ps = [task.prompt(task.train_problem(i, 0), tokenizer) for i in range(prompts)]
    batch = backend.generate(ps, group, SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=tokens,
                                                       seed=0))
    m = batch.completion_mask.bool()
    args = (batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
    with torch.no_grad():
        full = token_logprobs(model, *args, temperature=temperature)[0]
        renorm = token_logprobs(model, *args, temperature=temperature, keep=SamplingFilter(top_p=top_p))[0]
        logits = _logits(model, batch, temperature)
        mass = (torch.softmax(logits, -1) * keep_set(logits, top_p=top_p)).sum(-1)
    sampler = batch.sampler_logprobs.to(full.dtype)
    r_full, r_renorm = torch.exp(full - sampler)[m].double(), torch.exp(renorm - sampler)[m].double()
    out = {"kept_mass": float(mass[m].mean()), "ratio_full": float(r_full.mean()),
           "ratio_renorm": float(r_renorm.mean()),
           "outside_full": float(((r_full < 0.9) | (r_full > 1.1)).double().mean()),
           "outside_renorm": float(((r_renorm < 0.9) | (r_renorm > 1.1)).double().mean()), "tokens": int(m.sum())}
    print(f"\n{type(backend).__name__} top_p={top_p} T={temperature}, {out['tokens']} tokens: kept mass "
          f"{out['kept_mass']:.4f}; IS ratio full softmax {out['ratio_full']:.4f} ({out['outside_full']:.1%} outside "
          f"[0.9, 1.1]); renormalised {out['ratio_renorm']:.6f} ({out['outside_renorm']:.1%} outside)")
    return out


@pytest.mark.slow
def test_embedded_model_pr7269_measurement_hf(tokenizer):
    """SmolLM2-135M fp32, hf backend, top_p = 0.8: the mean full-softmax ratio is the mean kept mass
    (each token's ratio is its kept mass, up to fp32 rounding of the two forwards); renormalised
    over the keep set the mean ratio is within 1e-3 of 1."""
    from harness.model.models import EMBEDDED_NAME, load_causal_lm

    model = load_causal_lm(EMBEDDED_NAME, "float32")
    out = pr7269_measurement(model, tokenizer, build_backend("hf", model, tokenizer, progress=False))
    assert out["kept_mass"] < 0.97 and out["ratio_full"] < 0.97  # the bias is visible
    assert abs(out["ratio_full"] - out["kept_mass"]) < 1e-3
    assert abs(out["ratio_renorm"] - 1.0) < 1e-3
