"""``rollout.kv_cache=static`` (the hf backend's preallocated decoding cache) is a speed switch:
the same tokens, masks and sampler log-probs as ``dynamic``, with and without prefix sharing and
through the tool episodes' ``sample_ids``. Run in float64 (the two caches attend over different
key lengths, the extra positions masked, so they sum in different orders: ~1e-16 apart in double,
while a cache written at a wrong position changes the tokens)."""

import pytest
import torch

from harness.rollout import SamplingParams, build_backend
from harness.rollout.hf import static_cache
from tests.conftest import tiny_llama

PROMPTS = ["What is 2+3? Answer:", "Compute 17 times 3, please. Answer:", "Hi"]


def _model(tokenizer, params=SamplingParams(0.0, 1.0, 8), n=1):
    """A float64 tiny Llama whose EOS ids are tokens that some of its rows under ``params`` emit
    mid-way (a random model rarely samples the real EOS), so rows end at different lengths and
    the masks are exercised."""
    model = tiny_llama(tokenizer, dtype=torch.float64, initializer_range=0.5)  # large weights: varied tokens
    ids = build_backend("hf", model, tokenizer, progress=False).generate(PROMPTS, n, params).completion_ids
    model.generation_config.eos_token_id = sorted({int(t) for t in ids[:n:2, 3]})  # from the first prompt's rows
    return model


@pytest.mark.parametrize("share_prefix", [False, True])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_static_cache_samples_what_the_dynamic_cache_samples(tokenizer, share_prefix, temperature):
    params = SamplingParams(temperature=temperature, max_new_tokens=14, seed=5)
    model = _model(tokenizer, params, 4)
    seen, out = [], {}
    hook = model.model.register_forward_pre_hook(
        lambda mod, args, kw: seen.append(type(kw.get("past_key_values", kw.get("cache"))).__name__), with_kwargs=True)
    for kv in ("dynamic", "static"):
        seen.clear()
        out[kv] = build_backend("hf", model, tokenizer, progress=False, share_prefix=share_prefix,
                                kv_cache=kv).generate(PROMPTS, 4, params)
        out[kv, "caches"] = set(seen[1:])  # the decoding steps' cache (the first call may be the prefill)
    hook.remove()
    assert out["dynamic", "caches"] == {"DynamicCache"} and out["static", "caches"] == {"StaticCache"}
    d, s = out["dynamic"], out["static"]
    assert torch.equal(d.completion_ids, s.completion_ids) and torch.equal(d.completion_mask, s.completion_mask)
    assert len(set(map(tuple, d.completion_ids[:, :6].tolist()))) > 2  # varied tokens, not one constant row
    assert d.completion_mask.sum(1).unique().numel() > 1  # some rows stop early: the masks are exercised
    if temperature > 0:
        torch.testing.assert_close(s.sampler_logprobs, d.sampler_logprobs, rtol=0, atol=1e-10)
        assert (d.sampler_logprobs != 0).any()


def test_static_cache_sample_ids_matches_dynamic(tokenizer):
    """The episodes' path (:meth:`HFRollout.sample_ids`): ragged token rows, per-row budgets."""
    model = _model(tokenizer)
    rows = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    params = SamplingParams(temperature=1.0, max_new_tokens=10, seed=3)
    got = {kv: build_backend("hf", model, tokenizer, progress=False, kv_cache=kv)
           .sample_ids(rows, params, [10, 6, 8], None, [0, 1, 2]) for kv in ("dynamic", "static")}
    for a, b in zip(got["dynamic"], got["static"]):
        assert a.ids == b.ids and a.stop == b.stop
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-10
    assert any(len(s.ids) > 1 for s in got["dynamic"])


def test_static_cache_holds_the_prefill_at_its_positions(tokenizer):
    """The prefill's keys/values land at positions 0..t-1, the rest stays zero, and a prefill
    longer than the cache is refused with the sizes."""
    from harness.kv import prompt_cache

    model = _model(tokenizer)
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    _, dyn = prompt_cache(model, enc["input_ids"], enc["attention_mask"], torch.tensor([0, 0, 1, 2]))
    t = dyn.layers[0].keys.shape[-2]
    st = static_cache(model, t + 5, dyn)
    for dl, sl in zip(dyn.layers, st.layers):
        assert sl.keys.shape[-2] == t + 5 and int(sl.get_seq_length()) == t
        assert torch.equal(sl.keys[:, :, :t], dl.keys) and torch.equal(sl.values[:, :, :t], dl.values)
        assert not sl.keys[:, :, t:].any()
    with pytest.raises(ValueError, match=f"prefill of {t} positions does not fit a static cache of {t - 1}"):
        static_cache(model, t - 1, dyn)
