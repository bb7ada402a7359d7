"""What a finished LoRA run keeps (``checkpoint.keep_final``) and starting a run from it
(``lora.adapter_path``), :mod:`harness.model.lora`.

``keep_final=weights`` (the default) keeps peft's adapter folder: loaded back with
``peft.PeftModel.from_pretrained`` onto the base it gives the trained policy's log-probs
(float64, 1e-12); ``keep_final=merged`` keeps the merged model (tests/test_lora.py,
``test_lora_checkpoint_holds_adapters_and_their_optimizer_state``). A run with
``lora.adapter_path`` starts from the folder's adapters, not from fresh ones (``B = 0``).
"""

from __future__ import annotations

import json

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from harness.model.logprobs import token_logprobs
from harness.model.lora import ADAPTER_CONFIG, BASE_RECORD, base_state_dict
from harness.model.models import ModelLoadError, keep_float64
from harness.launch.run import build_components, prepare
from harness.train.trainer import Trainer
from harness.launch.validate import ConfigError, validate
from tests.conftest import QUICK, compose
from tests.knob_probe import MemoryTracker

# every token gets advantage -1 (overlong penalty, no baseline): the adapters must move in one step
MOVE = ("advantage=reinforce", "advantage.baseline=none", "overlong.buffer=11", "overlong.penalty=1.0", "train.lr=1e-2")
RUN = (*QUICK, "lora=peft", "lora.r=2", "train.steps=1", "eval.every=0", "eval.size=1", "model.dtype=float64", *MOVE)


def _batch(vocab: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    prompt, completion = torch.randint(3, vocab, (3, 5), generator=g), torch.randint(3, vocab, (3, 4), generator=g)
    return prompt, torch.ones_like(prompt), completion, torch.ones_like(completion)


def _logprobs(model, vocab: int) -> torch.Tensor:
    with torch.no_grad():
        return token_logprobs(model.eval(), *_batch(vocab))[0]


def _policy(*overrides: str):
    """The run's policy as built at startup (seeded as a run is: the same tiny base for the same seed)."""
    cfg = compose(*RUN, *overrides)
    prepare(cfg)
    return build_components(cfg)


def _train(ckpt_dir, *overrides: str):
    """One float64 step of a tiny LoRA run with its checkpoints in ``ckpt_dir``; returns the trained policy."""
    cfg = compose(*RUN, *overrides)
    prepare(cfg)
    task, tok, policy, _, backend = build_components(cfg)
    Trainer(cfg, task, tok, policy, backend, MemoryTracker(), checkpoint_dir=ckpt_dir).fit()
    return policy, tok


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny LoRA run (default ``keep_final=weights``): (its checkpoint dir, policy, tokenizer)."""
    ck = tmp_path_factory.mktemp("lora-run")
    policy, tok = _train(ck)
    return ck, policy, tok


def test_finished_lora_run_keeps_the_adapter_folder_and_no_merged_weights(trained):
    ck, policy, tok = trained
    final = ck / "final"
    files = {p.name for p in final.iterdir()}
    assert {ADAPTER_CONFIG, "adapter_model.safetensors", BASE_RECORD, "tokenizer.json"} <= files
    assert not files & {"model.safetensors", "config.json"}, files  # no merged full model
    conf = json.loads((final / ADAPTER_CONFIG).read_text())
    assert conf["peft_type"] == "LORA" and conf["r"] == 2 and conf["lora_alpha"] == 16.0
    assert sorted(conf["target_modules"]) == sorted(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                     "down_proj"])
    # the adapter tensors only: r (in + out) per target, 2 layers of the tiny model (hidden 32, MLP 64)
    from safetensors.torch import load_file

    saved = load_file(str(final / "adapter_model.safetensors"))
    assert sum(t.numel() for t in saved.values()) == 2 * 2 * (4 * (32 + 32) - 2 * 16 + 3 * (32 + 64))
    assert all(".lora_A." in k or ".lora_B." in k for k in saved)
    record = json.loads((final / BASE_RECORD).read_text())
    assert record["model"] == "tiny-random" and record["dtype"] == "float64"


def test_adapter_loads_back_with_peft_and_gives_the_trained_policys_log_probs(trained):
    """peft's own load (not the harness's) onto the base weights gives the end-of-run policy's
    log-probs in float64 to 1e-12; the base alone differs (the adapters moved)."""
    ck, policy, tok = trained
    base = keep_float64(AutoModelForCausalLM.from_config(policy.config).to(torch.float64))
    base.load_state_dict(base_state_dict(policy, merged=False))
    vocab = len(tok)
    before = _logprobs(base, vocab)
    loaded = peft.PeftModel.from_pretrained(base, str(ck / "final"))
    want = _logprobs(policy, vocab)
    got = _logprobs(loaded, vocab)
    assert got.dtype == torch.float64
    assert float((got - want).abs().max()) <= 1e-12
    assert float((before - want).abs().max()) > 1e-3  # would pass trivially if the adapters had not moved


def assert_run_starts_from_the_adapter(ck, policy, tok) -> None:
    """A run with ``lora.adapter_path=<ck>/final`` starts with the folder's adapters: its initial
    policy gives the finished run's log-probs (1e-12), where a fresh start (B = 0) gives the base's;
    its adapters train (requires_grad) and the base stays frozen."""
    vocab = len(tok)
    want = _logprobs(policy, vocab)
    _, _, start, _, _ = _policy(f"lora.adapter_path={ck / 'final'}")
    assert float((_logprobs(start, vocab) - want).abs().max()) <= 1e-12
    assert {n for n, p in start.named_parameters() if p.requires_grad} == {
        n for n, p in policy.named_parameters() if p.requires_grad}
    _, _, fresh, _, _ = _policy()
    assert float((_logprobs(fresh, vocab) - want).abs().max()) > 1e-3
    assert all(float(p.detach().abs().max()) == 0.0 for n, p in fresh.named_parameters() if ".lora_B." in n)


def test_a_run_starts_from_the_adapter_folder(trained):
    assert_run_starts_from_the_adapter(*trained)


def test_adapter_folder_for_another_base_is_refused(trained):
    """seed=1 draws other tiny base weights: the folder's base record does not match."""
    ck, _, _ = trained
    with pytest.raises(ModelLoadError, match=r"lora.adapter_path=.* was trained on the base 'tiny-random'"):
        _policy(f"lora.adapter_path={ck / 'final'}", "seed=1")


@pytest.mark.parametrize("override, match", [
    (["lora.r=4"], r"has r=2, but lora.r=4: set lora.r=2"),
    (["lora.alpha=8"], r"has lora_alpha=16.0, but lora.alpha=8.0"),
    (["lora.target_modules=[q_proj]"], r"has target_modules=.*, but lora.target_modules=\['q_proj'\]"),
])
def test_lora_keys_that_disagree_with_the_adapter_config_are_refused(trained, override, match):
    ck, _, _ = trained
    with pytest.raises(ConfigError, match=match):
        validate(compose(*RUN, f"lora.adapter_path={ck / 'final'}", *override))


def test_bad_adapter_folders_and_keep_final_merged_without_lora_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"lora.adapter_path='.*nowhere': no such folder"):
        validate(compose(*RUN, f"lora.adapter_path={tmp_path / 'nowhere'}"))
    (tmp_path / "model").mkdir()
    with pytest.raises(ConfigError, match=r"the folder has no adapter_config.json"):
        validate(compose(*RUN, f"lora.adapter_path={tmp_path / 'model'}"))
    (tmp_path / "dora").mkdir()  # a peft adapter that is not plain LoRA: lora.* would not describe it
    (tmp_path / "dora" / ADAPTER_CONFIG).write_text(json.dumps({
        "peft_type": "LORA", "r": 2, "lora_alpha": 16.0, "lora_dropout": 0.0, "use_dora": True,
        "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}))
    with pytest.raises(ConfigError, match=r"has use_dora=True; lora=peft trains plain LoRA"):
        validate(compose(*RUN, f"lora.adapter_path={tmp_path / 'dora'}"))
    with pytest.raises(ConfigError, match="checkpoint.keep_final=merged with lora=none: there are no adapters"):
        validate(compose(*QUICK, "checkpoint.keep_final=merged"))
    with pytest.raises(Exception, match="adapter_path"):  # lora=none has no such key: nothing would read it
        compose(*QUICK, "lora.adapter_path=/tmp")
