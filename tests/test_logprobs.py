"""Training log-probabilities must reproduce what sampling saw (left padding, temperature).

The two equalities of computations (left-padded vs alone, chunked vs full softmax) run in float64
to 1e-10, where the paths' different summation orders are ~1e-16 apart, and in float32 against its
rounding noise (1e-5).
"""

import pytest
import torch

from harness.logprobs import build_inputs, token_logprobs
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
