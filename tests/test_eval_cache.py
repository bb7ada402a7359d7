"""``eval.initial_cache``: the step-0 eval is replayed, not regenerated, by a run whose key matches,
and a run with the cache trains exactly as one without it (float64, compared to 1e-10).

Also the common random numbers of a study's arms (issue 45, item 2): two arms of one seed that
differ in a loss knob draw the same prompts in the same order and sample the same completions at
step 1 (a loss knob cannot change step-1 sampling); from step 2 their completions differ, because
the knob changed the step-1 update.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from benchmarks import study_cost
from harness.train import eval_cache
from tests.conftest import compose, run_job

# A random tiny model never answers nor stops: REINFORCE without a baseline plus the overlong
# penalty gives every token an advantage of -1, so the weights move at every step (tests/test_resume.py).
MOVING = ["advantage=reinforce", "advantage.baseline=none", "overlong.buffer=9", "overlong.penalty=1.0",
          "rollout.max_new_tokens=10", "train.lr=1e-3", "model.dtype=float64"]
DETERMINISTIC = ["train/reward_mean", "train/loss", "train/grad_norm", "train/entropy", "eval/accuracy",
                 "eval/completion_len_mean", "eval/format_rate"]


def _cfg(*extra):
    return compose("model=tiny", "task=arith", "eval.size=4", *extra)


class _Tiny(torch.nn.Module):
    def __init__(self, value: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((2, 2), value))


def test_key_changes_with_what_the_eval_depends_on_and_not_with_where_it_is_kept():
    from harness.tasks.base import Problem

    problems = [Problem(id="a", question="1+1", gold="2"), Problem(id="b", question="2+2", gold="4")]
    prompts = ["p1", "p2"]
    base = eval_cache.initial_eval_key(_cfg(), _Tiny(1.0), prompts, problems, seed=7)
    assert base == eval_cache.initial_eval_key(_cfg(), _Tiny(1.0), prompts, problems, seed=7)
    # not part of what the step-0 eval computes: the folder, when later evals run, the greedy eval's seed
    assert base == eval_cache.initial_eval_key(_cfg("eval.initial_cache=/x", "eval.every=3"), _Tiny(1.0),
                                               prompts, problems, seed=8)
    changed = {
        "weights": eval_cache.initial_eval_key(_cfg(), _Tiny(1.0 + 2**-20), prompts, problems, 7),
        "prompts": eval_cache.initial_eval_key(_cfg(), _Tiny(1.0), ["p1", "p2 "], problems, 7),
        "golds": eval_cache.initial_eval_key(_cfg(), _Tiny(1.0), prompts,
                                             [problems[0], Problem(id="b", question="2+2", gold="5")], 7),
        "max_new_tokens": eval_cache.initial_eval_key(_cfg("eval.max_new_tokens=13"), _Tiny(1.0), prompts, problems, 7),
        "batch_size": eval_cache.initial_eval_key(_cfg("eval.batch_size=3"), _Tiny(1.0), prompts, problems, 7),
        "task": eval_cache.initial_eval_key(_cfg("task.format_reward=0.5"), _Tiny(1.0), prompts, problems, 7),
        "rollout": eval_cache.initial_eval_key(_cfg("rollout.batch_size=2"), _Tiny(1.0), prompts, problems, 7),
        "sampled seed": eval_cache.initial_eval_key(_cfg("eval.num_samples=2"), _Tiny(1.0), prompts, problems, 8),
    }
    assert all(v != base for v in changed.values()), [k for k, v in changed.items() if v == base]
    assert len(set(changed.values())) == len(changed)
    assert changed["sampled seed"] != eval_cache.initial_eval_key(_cfg("eval.num_samples=2"), _Tiny(1.0), prompts,
                                                                  problems, 7)


def test_store_then_load_and_a_damaged_file_is_a_miss(tmp_path):
    payload = {"metrics": {"eval/accuracy": 0.25}, "rows": [], "correct": [0, 1, 0, 0], "lengths": [3, 4, 5, 6]}
    eval_cache.store(tmp_path, "k1", payload)
    assert eval_cache.load(tmp_path, "k1") == {**payload, "key": "k1"}
    assert eval_cache.load(tmp_path, "k2") is None
    (tmp_path / "k3.json").write_text("{not json")
    assert eval_cache.load(tmp_path, "k3") is None
    (tmp_path / "k4.json").write_text(json.dumps({**payload, "key": "other"}))  # renamed file: not this key
    assert eval_cache.load(tmp_path, "k4") is None
    assert not list(tmp_path.glob(".*.tmp"))


def _histories(history):
    return {k: history(k) for k in DETERMINISTIC}


def test_cached_step0_eval_is_replayed_and_training_is_unchanged(run_dir):
    cache = run_dir / "eval0"
    _, plain, h_plain = run_job(*MOVING, f"checkpoint.dir={run_dir}/a")
    _, first, h_first = run_job(*MOVING, f"checkpoint.dir={run_dir}/b", f"eval.initial_cache={cache}")
    _, second, h_second = run_job(*MOVING, f"checkpoint.dir={run_dir}/c", f"eval.initial_cache={cache}")
    assert "eval.initial_cached" not in plain.data.tags
    assert first.data.tags["eval.initial_cached"] == "false"
    assert second.data.tags["eval.initial_cached"] == "true"
    assert len(list(cache.glob("*.json"))) == 1
    a, b, c = _histories(h_plain), _histories(h_first), _histories(h_second)
    for k in DETERMINISTIC:
        assert [s for s, _ in a[k]] == [s for s, _ in c[k]], k
        for (_, x), (_, y), (_, z) in zip(a[k], b[k], c[k]):
            assert y == pytest.approx(x, abs=1e-10, rel=0) and z == pytest.approx(x, abs=1e-10, rel=0), k
    assert [s for s, _ in h_second("time/eval_s")] == [0, 1, 2]  # every eval timed, the replayed one too
    for k in ("time/process_age_s", "time/model_load_s", "time/engine_build_s"):  # a study run's split (docs/studies.md)
        assert [s for s, _ in h_second(k)] == [0] and h_second(k)[0][1] > 0, k

    # the split of benchmarks/study_cost: the plain and the storing run generated step 0, the third replayed it
    groups = study_cost.split(os.environ["MLFLOW_TRACKING_URI"])
    assert (len(groups["generated"]), len(groups["replayed"])) == (2, 1)
    for r in groups["generated"] + groups["replayed"]:
        assert all(math.isfinite(r[p]) and r[p] >= 0 for p in study_cost.PARTS), r
    replayed = groups["replayed"][0]
    assert replayed["training steps"] == pytest.approx(sum(v for _, v in h_second("time/step_s")), rel=1e-12)
    assert replayed["eval (step 0)"] == h_second("time/eval_s")[0][1]
    assert replayed["eval (final)"] == h_second("time/eval_s")[-1][1]
    assert replayed["model load"] == h_second("time/model_load_s")[0][1]

    # the replay is what the third run logged: a doctored cache entry shows up in its step-0 metrics
    entry = next(cache.glob("*.json"))
    doctored = json.loads(entry.read_text())
    doctored["metrics"]["eval/accuracy"] = 0.987
    entry.write_text(json.dumps(doctored))
    _, _, h_doctored = run_job(*MOVING, f"checkpoint.dir={run_dir}/d", f"eval.initial_cache={cache}")
    assert h_doctored("eval/accuracy")[0] == (0, 0.987)


def test_arms_differing_in_a_loss_knob_share_prompts_and_step1_completions(run_dir):
    """Common random numbers: same seed, aggregation token-mean vs seq-mean-token-sum."""
    records = {}
    for arm in ("token-mean", "seq-mean-token-sum"):
        seen = []
        run_job(*MOVING, "train.steps=3", "seed=5", f"loss_agg={arm}", f"checkpoint.dir={run_dir}/{arm}",
                on_step=seen.append)
        records[arm] = seen
    a, b = records["token-mean"], records["seq-mean-token-sum"]
    for ra, rb in zip(a, b):  # the same prompts, in the same order, at every step
        assert torch.equal(ra.batch.prompt_ids, rb.batch.prompt_ids), ra.step
    assert torch.equal(a[0].batch.completion_ids, b[0].batch.completion_ids)  # step 1 samples the same
    assert a[0].metrics["train/loss"] != pytest.approx(b[0].metrics["train/loss"], rel=1e-6)  # the knob acted
    assert any(not torch.equal(ra.logprobs, rb.logprobs) for ra, rb in zip(a[1:], b[1:]))  # so the policies parted


def test_process_age_counts_from_the_interpreter_start():
    code = "import time; time.sleep(0.6); from harness.runtime.perf import process_age_s; print(process_age_s())"
    age = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.6 <= age < 60


def test_refused_under_data_parallel(run_dir, monkeypatch):
    """Under torchrun each rank scores a share of the eval: a stored whole eval cannot stand in for it."""
    from harness.train import trainer

    class TwoRanks:
        is_main, distributed, world_size = True, True, 2

        def broadcast_module(self, module):
            pass

    monkeypatch.setattr(trainer, "world", TwoRanks)
    with pytest.raises(ValueError, match="eval.initial_cache=.*one-process run .world size 2"):
        run_job(*MOVING, f"checkpoint.dir={run_dir}/e", f"eval.initial_cache={run_dir}/eval0")
