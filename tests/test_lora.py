"""LoRA (``lora=peft``, :mod:`harness.model.lora`): the reference is the base model with the adapters off,
the policy starts equal to it, only the adapters train, the merged weights are ``W + (alpha / r) B A``
in the base model's names, checkpoints hold the adapters only, and every run logs
``perf/trainable_param_frac``. Exactness in float64 (``model.dtype=float64``) to 1e-10.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.model.logprobs import token_logprobs
from harness.model.lora import LoraConfig, PeftLora, base_state_dict, build_adapters, trainable_fraction
from harness.launch.validate import ConfigError, validate
from tests.conftest import QUICK, compose, tiny_llama
from tests.knob_probe import metric, probe

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _batch(vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (3, 5), generator=g)
    completion = torch.randint(3, vocab, (3, 4), generator=g)
    pmask = torch.ones_like(prompt)
    pmask[0, :2] = 0  # left padding on one row
    cmask = torch.ones_like(completion)
    cmask[2, 3:] = 0
    return prompt, pmask, completion, cmask


def _lora(model, **kw):
    return PeftLora(LoraConfig(**kw)).apply(model)


def _randomise_b(model, seed: int = 3):
    """Give every ``lora_B`` non-zero values, so that the adapters change the model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)


def test_reference_log_probs_are_the_base_models(tokenizer):
    """With trained (non-zero) adapters, the reference forward (adapters off) gives the base model's
    log-probs exactly, the adapted forward does not; the policy module is not copied."""
    base = tiny_llama(tokenizer, dtype=torch.float64)
    policy = _lora(copy.deepcopy(base))
    _randomise_b(policy)
    args = _batch(len(tokenizer))
    adapters = PeftLora(LoraConfig())
    ref = adapters.reference(policy)
    assert ref is policy  # no second copy of the weights
    with torch.no_grad():
        want = token_logprobs(base, *args)[0]
    with torch.no_grad(), adapters.reference_mode(ref):
        got = token_logprobs(ref, *args)[0]
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) <= 1e-10
    with torch.no_grad():
        adapted = token_logprobs(policy, *args)[0]  # the block ended: adapters back on
    assert float((adapted - want).abs().max()) > 1e-3


def test_step_zero_policy_equals_reference(tokenizer):
    """B starts at zero (peft's init): before any update the policy's log-probs are the reference's."""
    policy = _lora(tiny_llama(tokenizer, dtype=torch.float64))
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in policy.named_parameters() if ".lora_B." in n)
    assert any(float(p.detach().abs().max()) > 0.0 for n, p in policy.named_parameters() if ".lora_A." in n)
    args = _batch(len(tokenizer))
    adapters = PeftLora(LoraConfig())
    with torch.no_grad():
        on = token_logprobs(policy, *args)[0]
        with adapters.reference_mode(policy):
            off = token_logprobs(policy, *args)[0]
    assert float((on - off).abs().max()) <= 1e-10


def test_merged_state_is_w_plus_scaled_ba_in_base_names(tokenizer):
    """``base_state_dict``: the base model's names; each target's weight is W + (alpha / r) B @ A
    (computed here by hand), the others are W; the training module is not changed."""
    base = tiny_llama(tokenizer, dtype=torch.float64)
    policy = _lora(copy.deepcopy(base), r=4, alpha=2.0)
    _randomise_b(policy)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    merged = base_state_dict(policy)
    assert set(merged) == set(base.state_dict())
    layer = policy.model.layers[1].mlp.down_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    want = base.model.layers[1].mlp.down_proj.weight + (2.0 / 4) * B @ A
    assert float((merged["model.layers.1.mlp.down_proj.weight"] - want).abs().max()) <= 1e-12
    assert torch.equal(merged["model.embed_tokens.weight"], base.state_dict()["model.embed_tokens.weight"])
    assert all(torch.equal(v, policy.state_dict()[k]) for k, v in before.items())  # not mutated
    unmerged = base_state_dict(policy, merged=False)
    assert all(torch.equal(unmerged[k], v) for k, v in base.state_dict().items())
    # the merged weights give the adapted model's log-probs
    base.load_state_dict(merged)
    args = _batch(len(tokenizer))
    with torch.no_grad():
        assert float((token_logprobs(base, *args)[0] - token_logprobs(policy, *args)[0]).abs().max()) <= 1e-10


def test_none_leaves_the_model_alone_and_trainable_fraction(tokenizer):
    model = tiny_llama(tokenizer)
    assert build_adapters(None).apply(model) is model
    assert trainable_fraction(model) == 1.0
    lora = _lora(tiny_llama(tokenizer), r=2, target_modules=["q_proj"])
    n_adapter = sum(p.numel() for n, p in lora.named_parameters() if ".lora_" in n)
    assert n_adapter == 2 * 2 * (32 + 32)  # 2 layers x r (in + out), q_proj 32 -> 32
    assert trainable_fraction(lora) == pytest.approx(n_adapter / sum(p.numel() for p in lora.parameters()), rel=1e-15)


def test_lora_run_trains_only_the_adapters():
    """A 2-step float64 run: step 1's KL is exactly 0 (policy = reference), the base weights do not
    move, the adapters do, and ``perf/trainable_param_frac`` is logged (1.0 for full fine-tuning)."""
    obs = probe("lora=peft", "beta=0.5", "model.dtype=float64")
    assert metric(obs, "train/kl")[1] == 0.0
    assert metric(obs, "train/kl")[2] > 0.0
    assert metric(probe("lora=peft", "beta=0.0"), "train/loss")[2] is not None  # no reference at all
    full = probe("beta=0.5", "model.dtype=float64")
    assert full["metrics"][1]["train/kl"] == 0.0
    frac = {s: m for s, m in obs["records"][0].metrics.items() if s == "perf/trainable_param_frac"}
    assert 0 < frac["perf/trainable_param_frac"] < 0.1
    assert full["records"][0].metrics["perf/trainable_param_frac"] == 1.0


def test_lora_checkpoint_holds_adapters_and_their_optimizer_state(tmp_path):
    from harness.launch.run import build_components, prepare
    from harness.train.trainer import Trainer
    from tests.knob_probe import MemoryTracker

    cfg = compose(*QUICK, "lora=peft", "lora.r=2", "train.steps=1", "eval.every=0", "eval.size=1", "train.lr=1e-2",
                  "checkpoint.keep_final=merged",
                  # every token gets advantage -1 (overlong penalty, no baseline): the adapters must move
                  "advantage=reinforce", "advantage.baseline=none", "overlong.buffer=11", "overlong.penalty=1.0")
    prepare(cfg)
    task, tok, policy, critic, backend = build_components(cfg)
    trainer = Trainer(cfg, task, tok, policy, backend, MemoryTracker(), checkpoint_dir=tmp_path)
    base = {k: v.clone() for k, v in base_state_dict(policy, merged=False).items()}
    trainer.fit()  # one step: the base weights stay, the adapters move
    assert all(torch.equal(v, base[k]) for k, v in base_state_dict(policy, merged=False).items())
    assert max(float(p.detach().abs().max()) for n, p in policy.named_parameters() if ".lora_B." in n) > 0
    # checkpoint.keep_final=merged: the merged model, loadable without peft (the default, weights, keeps
    # the adapter folder: tests/test_lora_adapter.py)
    assert not (tmp_path / "final" / "adapter_config.json").exists()
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    merged = base_state_dict(policy)
    assert all(torch.equal(v, merged[k]) for k, v in final.state_dict().items())
    state = trainer._model_states()
    names = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert set(state["policy"]) == names and all(".lora_" in n for n in names)
    assert len(state["optimizer"]["param_groups"][0]["params"]) == len(names)
    assert state["ref"] is None
    trainer.adapters.load_trainable_state(policy, state["policy"])  # round trip
    trainer.opt.load_state_dict(state["optimizer"])
    with pytest.raises(RuntimeError, match="lora"):
        trainer.adapters.load_trainable_state(policy, {"model.embed_tokens.weight": torch.zeros(1)})


def test_ppo_critic_trains_adapters_and_value_head():
    from harness.launch.run import build_components, prepare

    cfg = compose(*QUICK, "lora=peft", "advantage=ppo")
    prepare(cfg)
    _, _, policy, critic, _ = build_components(cfg)
    trained = {id(p) for g in critic.opt.param_groups for p in g["params"]}
    named = dict(critic.model.named_parameters())
    assert {n for n, p in named.items() if id(p) in trained} == {
        n for n in named if ".lora_" in n or n.startswith("value_head.")}
    assert set(critic.state_dict()["model"]) == {n for n in named if id(named[n]) in trained}
    assert critic.model.lm is not policy
    critic.load_state_dict(critic.state_dict())  # the checkpoint round trip (adapters, head, AdamW)
    with pytest.raises(RuntimeError, match="lora"):
        critic.load_state_dict({"model": {}, "optimizer": critic.opt.state_dict()})


@pytest.mark.parametrize("override, match", [
    (["lora.r=0"], "lora.r=0"),
    (["lora.alpha=0"], "lora.alpha"),
    (["lora.dropout=1.0"], "lora.dropout"),
    (["lora.target_modules=[]"], "lora.target_modules"),
    (["kl.ref_refresh_steps=2"], "kl.ref_refresh_steps=2 with lora=peft"),
    (["advantage=ppo", "critic.init=random"], "critic.init=random with lora=peft"),
    (["rollout=vllm", "rollout.lora_sync=adapter", "lora.r=513"], "rollout.lora_sync=adapter with lora.r=513"),
])
def test_bad_lora_settings_are_refused(override, match):
    with pytest.raises(ConfigError, match=match):
        validate(compose(*QUICK, "lora=peft", *override))


def test_fsdp2_with_lora_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="train.sharding=fsdp2 with lora=peft"):
        validate(compose(*QUICK, "lora=peft", "train.sharding=fsdp2"))


def test_provenance_records_the_base_digest_and_the_adapter(tokenizer):
    """model.weights_sha256 of a LoRA policy is its base weights' digest (the full fine-tuning run's),
    model.adapter the lora config and model.adapter_sha256 the adapters' initial tensors."""
    from harness.runtime import provenance

    cfg = compose(*QUICK, "lora=peft", "lora.r=2")
    base = tiny_llama(tokenizer)
    policy = build_adapters(cfg.lora).apply(copy.deepcopy(base))
    prov = provenance.collect(cfg, None, policy)
    assert prov["provenance.model.weights_sha256"] == provenance.state_dict_sha256(base)
    assert '"r": 2' in prov["provenance.model.adapter"] and '"name": "peft"' in prov["provenance.model.adapter"]
    assert len(prov["provenance.model.adapter_sha256"]) == 64
    assert "provenance.model.adapter" not in provenance.collect(compose(*QUICK), None, base)


def test_gradient_checkpointing_gives_the_adapters_the_same_gradients(tokenizer):
    """model.gradient_checkpointing=true with frozen embeddings: the adapters still get gradients
    (harness.model.lora enables input gradients), the same as without checkpointing (float64)."""
    grads = []
    for checkpointing in (False, True):
        model = tiny_llama(tokenizer, dtype=torch.float64)
        if checkpointing:
            model.gradient_checkpointing_enable()
        model = _lora(model.train())
        token_logprobs(model, *_batch(len(tokenizer)))[0].sum().backward()
        grads.append(torch.cat([p.grad.flatten() for n, p in model.named_parameters() if ".lora_B." in n]))
    assert float(grads[0].abs().max()) > 1e-3
    assert float((grads[0] - grads[1]).abs().max()) <= 1e-10
