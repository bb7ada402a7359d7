"""One short real step with the embedded SmolLM2-135M-Instruct (the default model)."""

import pytest

from tests.conftest import run_job


@pytest.mark.slow
def test_embedded_model_one_step(run_dir):
    # REINFORCE without a baseline and a format reward: every formatted sample has a positive
    # advantage, so a real gradient flows whatever is sampled (2-shot arith: ~100% formatted)
    acc, run, history = run_job(
        "model=smollm2", "train.steps=1", "train.prompts_per_step=1", "group_size=2",
        "rollout.max_new_tokens=32", "rollout.temperature=0.7", "eval.size=2", "beta=0.04",
        "advantage=reinforce", "advantage.baseline=none", "task.format_reward=0.5",
    )
    assert run.data.tags["model"] == "embedded:smollm2-135m-instruct"
    m = run.data.metrics
    assert m["train/completion_len_mean"] > 0
    assert m["train/format_rate"] > 0 and m["train/reward_mean"] > 0
    assert m["train/grad_norm"] > 0  # a real gradient flowed through the 135M model
    assert m["train/ratio_mean"] == 1.0
    # the pretrained model writes real text; some of it is the expected '#### n' format at 2 shots
    assert 0.0 <= acc <= 1.0
