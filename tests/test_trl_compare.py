"""benchmarks/trl_compare.py: ratios and markdown on hand-made numbers, the harness worker with the
tiny model, and (only where TRL is installed in .bench/) the TRL worker on the same tiny setup."""

import os
import subprocess
import sys

import pytest

from benchmarks import trl_compare as tc

TINY = dict(model="tiny", prompts=2, group_size=4, max_new_tokens=8, warmup=1, steps=1, rounds=1)


def _side(step_s, tokens):
    return {"load_s": 1.0, "steps": [{"step_s": s, "completion_tokens": t, "time/step_s": s, "time/rollout_s": s / 2}
                                     for s, t in zip(step_s, tokens)]}


def test_summaries_ratios_and_markdown():
    rounds = [{"harness": tc.summarize(_side([10.0, 30.0], [200, 200])), "trl": tc.summarize(_side([40.0], [100]))},
              {"harness": tc.summarize(_side([20.0], [300])), "trl": tc.summarize(_side([30.0], [150]))}]
    h = rounds[0]["harness"]
    assert h["step_s"] == 20.0 and h["tokens_per_step"] == 200 and h["tokens_per_s"] == 10.0
    assert h["split"]["time/rollout_s"] == 10.0
    ratios = tc.pair_ratios(rounds)
    assert ratios == pytest.approx([10.0 / 2.5, 15.0 / 5.0])
    s = tc.resolve_settings(**TINY)
    result = {"settings": s, "rounds": rounds, "ratios": ratios, "mean_ratio": sum(ratios) / 2, "wall_s": 1.0,
              "trl_non_defaults": tc.trl_non_defaults(s)}
    text = "\n".join(tc.markdown(result))
    assert "4.00, 3.00; **mean 3.50x**" in text
    assert "| A harness | 20.0 | 200 | 10.0 | 0.00 | 1.0 |" in text and "| B trl | 40.0 | 100 | 2.5 | 0.00 | 1.0 |" in text
    assert "`gradient_checkpointing=False`" in text and "`max_completion_length=8`" in text
    assert "Harness step-time split" in text and "rollout 10.0 s" in text


def test_trl_micro_batches_match_the_harness():
    s = tc.resolve_settings(**{**TINY, "prompts": 4, "group_size": 8, "micro_batch_size": 8})
    kw = tc.trl_config_kwargs(s, "/tmp/unused")
    # one generation batch of P x G = 32, trained in 4 micro-batches of 8, one optimizer step
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"], kw["steps_per_generation"]) == (8, 4, 4)
    assert "`per_device_train_batch_size / gradient_accumulation_steps / steps_per_generation=8 / 4 / 4`" in "\n".join(
        tc.markdown({"settings": s, "rounds": [], "ratios": [], "mean_ratio": None, "wall_s": 1.0,
                     "trl_non_defaults": tc.trl_non_defaults(s)}))
    s = tc.resolve_settings(**{**TINY, "prompts": 3, "group_size": 2, "micro_batch_size": 4})  # 4 does not divide 6
    kw = tc.trl_config_kwargs(s, "/tmp/unused")
    assert (kw["per_device_train_batch_size"], kw["gradient_accumulation_steps"]) == (6, 1)


def test_harness_worker_runs_ppo_with_its_critic():
    out = tc.harness_worker(tc.resolve_settings(**{**TINY, "warmup": 0, "advantage": "ppo", "order": "A"}))
    assert "train/value_loss" in out["steps"][0]  # the critic was built and trained


def test_settings_are_checked():
    with pytest.raises(ValueError, match="unknown settings"):
        tc.resolve_settings(group=3)
    with pytest.raises(ValueError, match="order"):
        tc.resolve_settings(model="tiny", order="AC")
    with pytest.raises(ValueError, match="only runs grpo"):
        tc.resolve_settings(model="tiny", advantage="ppo", order="AB")


def test_missing_trl_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(tc, "TRL_DIR", tmp_path / "nothing-here")
    with pytest.raises(tc.TRLUnavailable, match="pip install --no-deps --target"):
        tc.ensure_trl(install=False)


def test_harness_worker_tiny_uses_the_trainer_prompts():
    s = tc.resolve_settings(**TINY)
    out = tc.harness_worker(s)
    assert out["side"] == "harness" and len(out["warmup"]) == 1 and len(out["steps"]) == 1
    rec = out["steps"][0]
    assert 0 < rec["completion_tokens"] <= 2 * 4 * 8 and rec["step_s"] > 0 and "time/rollout_s" in rec
    assert rec["peak_mem_bytes"] > 1e6
    cfg, task, tok, *_ = tc._build(s)
    prompts, golds = tc.train_prompts(cfg, task, tok, 2)
    assert len(prompts) == 4 and prompts[0] == task.prompt(task.train_problem(0, cfg.seed), tok)


def _trl_importable():
    if not tc.TRL_DIR.exists():
        return False
    env = {**os.environ, "PYTHONPATH": str(tc.TRL_DIR)}
    r = subprocess.run([sys.executable, "-c", "import trl"], env=env, capture_output=True)
    return r.returncode == 0


@pytest.mark.skipif(not _trl_importable(), reason=f"TRL not installed in {tc.TRL_DIR} ({tc.PIP_CMD})")
def test_trl_worker_tiny_same_setup(tmp_path):
    s = tc.resolve_settings(**TINY)
    out = tc.run_worker("trl", s, tmp_path, tc.TRL_DIR)
    assert out["info"]["prompt_ids_identical"] and not out["info"]["gradient_checkpointing"]
    assert out["info"]["loss_type"] == "dapo" and out["info"]["scale_rewards"] == "group"
    rec = out["steps"][0]
    assert 0 < rec["completion_tokens"] <= 2 * 4 * 8 and rec["completions"] == 8 and rec["step_s"] > 0
    assert rec["trl/completions/mean_length"] == pytest.approx(rec["completion_tokens"] / 8)
