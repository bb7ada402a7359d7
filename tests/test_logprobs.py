"""Training log-probabilities must reproduce what sampling saw (left padding, temperature).

The two equalities of computations (left-padded vs alone, chunked vs full softmax) run in float64
to 1e-10, where the paths' different summation orders are ~1e-16 apart, and in float32 against its
rounding noise (1e-5).
"""

import pytest
import torch

from harness.model.logprobs import build_inputs, token_logprobs
from harness.rollout.hf import completion_mask_from_ids
from tests.conftest import tiny_llama


DTYPES = pytest.mark.parametrize("dtype,tol", [
    pytest.param(torch.float64, dict(atol=1e-12, rtol=1e-10), id="float64"),
    pytest.param(torch.float32, dict(atol=1e-5, rtol=1e-5), id="float32", marks=pytest.mark.exactness)])


def _ids(tokenizer, text):
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


@DTYPES
def test_left_padding_parity(tokenizer, dtype, tol):
    """A row with 5 left pads gives the same completion logprobs as the unpadded row."""
    model = tiny_llama(tokenizer, dtype=dtype).eval()
    prompt = _ids(tokenizer, "Ana has 12 apples. How many?")
    comp = _ids(tokenizer, " She has 12.")
    pad = torch.full((1, 5), tokenizer.pad_token_id)
    p_ids = torch.cat([torch.cat([pad, prompt], 1), torch.cat([prompt, prompt[:, :5]], 1)])
    p_mask = torch.cat([torch.cat([torch.zeros(1, 5), torch.ones_like(prompt)], 1),
                        torch.ones(1, prompt.shape[1] + 5)]).long()
    c_ids, c_mask = comp.repeat(2, 1), torch.ones(2, comp.shape[1], dtype=torch.long)
    padded, _ = token_logprobs(model, p_ids[:1], p_mask[:1], c_ids[:1], c_mask[:1])
    alone, _ = token_logprobs(model, prompt, torch.ones_like(prompt), comp, torch.ones_like(comp))
    assert padded.dtype == dtype
    torch.testing.assert_close(padded, alone, **tol)


@DTYPES
def test_chunked_logprobs_equal_full_softmax_with_temperature(tokenizer, dtype, tol):
    """Chunked LM-head log-probs (chunk=3) equal log_softmax(logits / T) of a plain forward."""
    model = tiny_llama(tokenizer, dtype=dtype).eval()
    prompt, comp = _ids(tokenizer, "1 + 2 ="), _ids(tokenizer, " 3, and 4 + 5 = 9")
    logp, ent = token_logprobs(model, prompt, torch.ones_like(prompt), comp, torch.ones_like(comp),
                               temperature=0.7, chunk=3, with_entropy=True)
    full = torch.cat([prompt, comp], 1)
    logits = model(full).logits[:, prompt.shape[1] - 1 : -1] / 0.7
    ref = torch.log_softmax(logits, -1)
    assert logp.dtype == ent.dtype == dtype
    torch.testing.assert_close(logp, ref.gather(-1, comp.unsqueeze(-1)).squeeze(-1), **tol)
    # the entropy sums 49,152 terms: float32 to 1e-4
    ent_tol = tol if dtype == torch.float64 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent, -(ref.exp() * ref).sum(-1), **ent_tol)


def test_build_inputs_positions_match_generate_convention():
    p_ids = torch.tensor([[0, 0, 5, 6]])
    p_mask = torch.tensor([[0, 0, 1, 1]])
    c_ids, c_mask = torch.tensor([[7, 8, 2]]), torch.tensor([[1, 1, 0]])
    ids, mask, pos = build_inputs(p_ids, p_mask, c_ids, c_mask)
    assert ids.tolist() == [[0, 0, 5, 6, 7, 8, 2]]
    assert pos.tolist() == [[0, 0, 0, 1, 2, 3, 3]]


def test_completion_mask_stops_after_first_eos():
    ids = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 9, 9, 9]])
    mask, truncated = completion_mask_from_ids(ids, {2})
    assert mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    assert truncated.tolist() == [False, True, False]


def test_sampled_tokens_have_training_logprobs_of_generate(tokenizer):
    """Sampling scores from generate (temperature 0.8) equal our training log-probs: ratio 1."""
    from harness.rollout import SamplingParams
    from harness.rollout import build_backend

    model = tiny_llama(tokenizer).eval()
    torch.manual_seed(0)
    backend = build_backend("hf", model, tokenizer, progress=False)
    prompts = ["Ana has 3 apples.", "A much longer prompt about Ben who has 45 marbles and more."]
    batch = backend.generate(prompts, 2, SamplingParams(temperature=0.8, max_new_tokens=6))
    assert batch.completion_ids.shape[0] == 4
    assert batch.texts[0] is not None and batch.group_size == 2
    assert (batch.prompt_ids[0] == batch.prompt_ids[1]).all()  # group-major rows
    # generate again with output_scores to get sampling log-probs
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(1)
    out = model.generate(**enc, do_sample=True, temperature=0.8, top_k=0, top_p=1.0, max_new_tokens=6,
                         output_scores=True, return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
    comp = out.sequences[:, enc["input_ids"].shape[1]:]
    scores = torch.stack(out.scores, 1).log_softmax(-1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
    mask, _ = completion_mask_from_ids(comp, {tokenizer.eos_token_id})
    ours, _ = token_logprobs(model, enc["input_ids"], enc["attention_mask"], comp, mask, temperature=0.8)
    torch.testing.assert_close(ours * mask, scores * mask, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("with_entropy,bias", [(False, False), (True, False), (True, True)])
def test_fused_head_equals_unfused_autograd_values_and_gradients(with_entropy, bias):
    """The fused LM head + log-softmax + gather (issue 28) against the plain autograd ops, in float64.

    Same loss on both sides: ``sum(a * logp) + sum(c * entropy)`` with random weights ``a``, ``c``,
    so a wrong sign or a missing term in the closed-form backward moves a gradient by O(1); the
    two sides differ only in summation order (~1e-16). Gradients of the hidden states, the head
    weight and its bias are all compared.
    """
    from harness.model.logprobs import LinearLogSoftmaxGather, _chunk_logprobs

    g = torch.Generator().manual_seed(0)
    B, c, H, V, T = 3, 5, 16, 50, 0.7
    hidden = torch.randn(B, c, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    targets = torch.randint(0, V, (B, c), generator=g)
    a, cw = torch.randn(B, c, generator=g, dtype=torch.float64), torch.randn(B, c, generator=g, dtype=torch.float64)

    def run(fn):
        leaves = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
        leaves.append(b.clone().requires_grad_() if b is not None else None)
        lp, ent = fn(leaves[0], leaves[1], leaves[2], targets, T, with_entropy)
        ((a * lp).sum() + (cw * ent).sum() * with_entropy).backward()
        return lp.detach(), ent.detach(), [x.grad for x in leaves if x is not None]

    lp_f, ent_f, grads_f = run(LinearLogSoftmaxGather.apply)
    lp_u, ent_u, grads_u = run(_chunk_logprobs)
    tol = dict(atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(lp_f, lp_u, **tol)
    torch.testing.assert_close(ent_f, ent_u, **tol)
    assert len(grads_f) == len(grads_u) == 2 + bias
    for gf, gu in zip(grads_f, grads_u):
        assert gu.abs().max() > 1e-3  # the gradient is not trivially zero
        torch.testing.assert_close(gf, gu, **tol)


def test_fused_head_frozen_weight_gets_no_gradient():
    """A frozen head (LoRA trains adapters only) gets no gradient; the hidden states still do."""
    from harness.model.logprobs import LinearLogSoftmaxGather, _chunk_logprobs

    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 4, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(30, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 30, (2, 4), generator=g)
    grads = []
    for fn in (LinearLogSoftmaxGather.apply, _chunk_logprobs):
        h = hidden.clone().requires_grad_()
        w = weight.clone()
        lp, _ = fn(h, w, None, targets, 1.0, False)
        lp.sum().backward()
        assert w.grad is None
        grads.append(h.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-12, rtol=1e-10)
