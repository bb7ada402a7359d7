"""``train.precision``: bf16 autocast runs the matmuls in bf16 and keeps the rest in fp32; ``auto``
decides from a measurement. Nothing here depends on which CPU the tests run on."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose, run_job


def _batch(tokenizer, B=4, Tp=5, Tc=6, seed=0):
    from harness.train.update import TrainBatch

    g = torch.Generator().manual_seed(seed)
    p = torch.randint(3, len(tokenizer) - 1, (B, Tp), generator=g)
    c = torch.randint(3, len(tokenizer) - 1, (B, Tc), generator=g)
    mask = torch.ones(B, Tc, dtype=torch.long)
    mask[1, 4:] = 0
    adv = torch.randn(B, 1, generator=g).expand(B, Tc).clone()
    return TrainBatch(p, torch.ones(B, Tp, dtype=torch.long), c, mask, adv)


def _matmul_dtypes(model, cfg, batch):
    from harness.algo import build_algorithm
    from harness.train.update import policy_pass

    seen = []
    hooks = [m.register_forward_hook(lambda mod, i, o: seen.append(o.dtype))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    model.zero_grad()
    stats = policy_pass(model, batch, build_algorithm(cfg), 2)
    for h in hooks:
        h.remove()
    grads = [p.grad.dtype for p in model.parameters() if p.grad is not None]
    return set(seen), set(grads), stats


def test_bf16_autocast_runs_linears_in_bf16_with_fp32_master_weights_and_loss(tokenizer):
    from tests.conftest import tiny_llama

    model = tiny_llama(tokenizer)
    batch = _batch(tokenizer)
    fp32_cfg = compose("model=tiny", "train.precision=fp32", "beta=0")
    bf16_cfg = compose("model=tiny", "train.precision=bf16-autocast", "beta=0")
    out32, grads32, s32 = _matmul_dtypes(model, fp32_cfg, batch)
    g32 = [p.grad.clone() for p in model.parameters()]
    out16, grads16, s16 = _matmul_dtypes(model, bf16_cfg, batch)
    assert out32 == {torch.float32} and out16 == {torch.bfloat16}
    assert grads32 == grads16 == {torch.float32}  # master weights and their gradients stay fp32
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # the knob is on: the gradient and the entropy move a little (bf16 rounding), not a lot. (On-policy the
    # loss value is -mean(A) whatever the log-probs are, since the ratio is exactly 1 in both.)
    g16 = torch.cat([p.grad.flatten() for p in model.parameters()])
    g32 = torch.cat([g.flatten() for g in g32])
    assert float((g16 - g32).abs().max()) > 1e-6
    assert float(torch.nn.functional.cosine_similarity(g32, g16, dim=0)) > 0.95
    assert s16["entropy"] != s32["entropy"]
    assert s16["entropy"] == pytest.approx(s32["entropy"], rel=0.02)


def test_logprobs_stay_fp32_under_autocast(tokenizer):
    from harness.model.logprobs import token_logprobs
    from harness.model.precision import autocast
    from tests.conftest import tiny_llama

    model = tiny_llama(tokenizer)
    b = _batch(tokenizer)
    with autocast("bf16-autocast"):
        lp, ent = token_logprobs(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.loss_mask, with_entropy=True)
    assert lp.dtype == ent.dtype == torch.float32


def test_auto_chooses_by_the_measurement():
    from harness.model import precision

    assert precision.choose({"fp32_gflops": 100.0, "bf16_gflops": 400.0, "speedup": 4.0}) == "bf16-autocast"
    assert precision.LAST_PROBE["chosen"] == "bf16-autocast"
    assert precision.choose({"fp32_gflops": 100.0, "bf16_gflops": 1.0, "speedup": 0.01}) == "fp32"
    assert precision.choose({"fp32_gflops": 100.0, "bf16_gflops": 110.0, "speedup": 1.1}) == "fp32"


def test_probe_measures_both_paths():
    from harness.model import precision

    f = precision.probe(tokens=32, hidden=64, inner=128, min_seconds=0.02)
    assert f["fp32_gflops"] > 0 and f["bf16_gflops"] > 0
    assert f["speedup"] == pytest.approx(f["bf16_gflops"] / f["fp32_gflops"], rel=0.01)


@pytest.mark.parametrize("measured,expected", [(4.0, "bf16-autocast"), (0.01, "fp32")])
def test_auto_is_resolved_into_the_record(run_dir, monkeypatch, measured, expected):
    from harness.model import precision

    monkeypatch.setattr(precision, "probe", lambda **kw: {"fp32_gflops": 10.0, "bf16_gflops": 10.0 * measured,
                                                         "speedup": measured})
    _, run, _ = run_job("train.precision=auto", "train.steps=1")
    assert run.data.params["train.precision"] == expected  # the rerun repeats the choice without probing
    assert run.data.tags["precision.auto.chosen"] == expected
    assert float(run.data.tags["precision.auto.speedup"]) == measured


def test_mixed_precision_needs_fp32_master_weights():
    from harness.launch.validate import ConfigError, validate

    with pytest.raises(ConfigError, match="train.precision=bf16-autocast with model.dtype=bfloat16"):
        validate(compose("model=tiny", "train.precision=bf16-autocast", "model.dtype=bfloat16"))
    with pytest.raises(ConfigError, match="train.precision"):
        validate(compose("model=tiny", "train.precision=bf16"))


def test_float64_is_accepted_with_hf_and_refused_with_vllm():
    """model.dtype=float64 (double end to end, for exactness checks) runs on the hf backend; vLLM
    has no float64 kernels, so startup refuses it naming both keys."""
    from harness.launch.validate import ConfigError, validate

    validate(compose("model=tiny", "model.dtype=float64"))
    with pytest.raises(ConfigError, match="model.dtype=float64 with rollout=vllm"):
        validate(compose("model=tiny", "model.dtype=float64", "rollout=vllm"))
    with pytest.raises(ConfigError, match="model.dtype='float128'"):
        validate(compose("model=tiny", "model.dtype=float128"))
