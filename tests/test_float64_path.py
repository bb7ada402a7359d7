"""A float64 model computes in float64 end to end, as a run loads it (issue 44).

The exactness tests of the suite (2 ranks = 1 process, resume, micro-batching, prefix sharing)
compare float64 runs to 1e-10: they hold only if nothing inside the model rounds to float32.
transformers 5.25 loads models with ``use_kernels=True`` and re-kernelizes them at every
``train()`` / ``eval()``, which rebound each RMSNorm's forward to the library's (input cast to
float32) and undid :func:`harness.model.models.keep_float64`. A float32 rounding is the same for the
same value, so a forward alone stays batch-invariant; it shows in the backward, where the rows
of a batch (and the rows sharing a prompt) sum their gradients in another order than its halves
do. So these tests load the model as a run does (:func:`harness.model.models.load_causal_lm`, then
``train()``), and check

* the norms against the float64 formula (a cast to float32 is ~1e-8 off, float64 ~1e-16);
* the log-probs and the gradient of a batch against those of its two halves, with left padding
  and prefix sharing, to 1e-12 (relative; float32 rounding inside gives ~1e-9 to 1e-7).

No torchrun: this is the unit that fails when the leak is back, whatever the transformers version.
"""

from __future__ import annotations

import pytest
import torch

from harness.model.logprobs import token_logprobs
from harness.model.models import keep_float64, load_causal_lm
from tests.conftest import tiny_llama

U, G, TP, TC = 4, 4, 23, 9  # 4 prompts x 4 completions: every prompt repeats (prefix sharing applies)


@pytest.fixture(scope="module")
def loaded(tokenizer, tmp_path_factory):
    """The tiny Llama saved to a folder and loaded back in float64 the way a run loads a model."""
    folder = tmp_path_factory.mktemp("tiny64")
    tiny_llama(tokenizer).save_pretrained(folder)
    model = load_causal_lm(str(folder), "float64")
    model.eval()
    model.train()  # the mode changes a run makes (transformers 5.25 re-kernelized on each)
    return model


def _batch(pad_id: int, seed: int = 0):
    """``U`` distinct left-padded prompts (0, 3, 6, 9 pads), each repeated ``G`` times, and
    right-padded completions of uneven length."""
    g = torch.Generator().manual_seed(seed)
    prompt_ids = torch.randint(3, 1000, (U, TP), generator=g)
    prompt_mask = torch.ones(U, TP, dtype=torch.long)
    for u in range(U):
        prompt_ids[u, : 3 * u], prompt_mask[u, : 3 * u] = pad_id, 0
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(G, 0), prompt_mask.repeat_interleave(G, 0)
    completion_ids = torch.randint(3, 1000, (U * G, TC), generator=g)
    completion_mask = torch.ones(U * G, TC, dtype=torch.long)
    completion_mask[1, 4:] = completion_mask[6, 2:] = completion_mask[11, 7:] = 0
    weights = torch.randn(U * G, TC, generator=g, dtype=torch.float64) * completion_mask
    return prompt_ids, prompt_mask, completion_ids, completion_mask, weights


def _trim(rows, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """Rows ``rows`` with the padding columns none of them uses removed (a micro-batch or a rank's
    shard is padded to its own longest row, not the whole batch's)."""
    p_keep, c_keep = prompt_mask[rows].any(0), completion_mask[rows].any(0)
    return (prompt_ids[rows][:, p_keep], prompt_mask[rows][:, p_keep],
            completion_ids[rows][:, c_keep], completion_mask[rows][:, c_keep])


def _pass(model, parts, batch):
    """Log-probs ``[B, TC]`` (zero past each part's width) and the gradient of ``sum(w * logp)``,
    accumulated over ``parts`` (lists of rows)."""
    *tensors, weights = batch
    model.zero_grad()
    out = torch.zeros(weights.shape, dtype=torch.float64)
    for rows in parts:
        p, pm, c, cm = _trim(rows, *tensors)
        logp, _ = token_logprobs(model, p, pm, c, cm, share_prefix=True)
        (logp * weights[rows][:, : logp.shape[1]]).sum().backward()
        out[rows, : logp.shape[1]] = logp.detach()
    grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return out, grad


def test_loaded_float64_norms_compute_in_float64(loaded):
    x = torch.randn(3, 5, loaded.config.hidden_size, dtype=torch.float64, generator=torch.Generator().manual_seed(2)) * 7
    for name, module in loaded.named_modules():
        if type(module).__name__.endswith("RMSNorm"):
            want = module.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + module.variance_epsilon))
            got = module(x)
            assert got.dtype == torch.float64
            torch.testing.assert_close(got, want, rtol=1e-14, atol=0, msg=f"{name} does not compute in float64")


@pytest.mark.parametrize("split", ["first-second", "even-odd"])
def test_float64_batch_equals_its_halves_with_left_padding_and_prefix_sharing(loaded, tokenizer, split):
    """Forward and backward of the 16 rows at once, and of two halves (each padded to its own
    width), agree to 1e-12: float64 summed in another order, nothing rounded to float32.
    ``first-second``: rows 0-7 and 8-15 (whole groups; the halves' prompt widths differ);
    ``even-odd``: every group split over the halves, so each half sums another part of a shared
    prompt's gradient (as micro-batches and ranks that cut a group do)."""
    batch = _batch(tokenizer.pad_token_id)
    B = U * G
    halves = ([list(range(B // 2)), list(range(B // 2, B))] if split == "first-second"
              else [list(range(0, B, 2)), list(range(1, B, 2))])
    logp_full, grad_full = _pass(loaded, [list(range(B))], batch)
    logp_halves, grad_halves = _pass(loaded, halves, batch)
    mask = batch[3].bool()
    assert logp_full.dtype == torch.float64 and float(grad_full.abs().max()) > 1e-3  # not vacuous
    torch.testing.assert_close(logp_halves[mask], logp_full[mask], rtol=1e-12, atol=1e-12)
    worst = float((grad_full - grad_halves).abs().max() / grad_full.abs().max())
    assert worst < 1e-12, f"the gradient of the halves differs by {worst:.3g} (relative): a float32 rounding in the float64 path"


def test_kernelized_float64_model_is_refused(tokenizer):
    """keep_float64 refuses a model whose train()/eval() would re-kernelize its norms."""
    model = tiny_llama(tokenizer).to(torch.float64)
    model._use_kernels = True  # what transformers' use_kernels property reads
    with pytest.raises(ValueError, match="use_kernels=False"):
        keep_float64(model)
