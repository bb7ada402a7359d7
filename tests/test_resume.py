"""Exact resume: a run killed with SIGKILL at a random step and rerun with the same command
ends with the same metric history as an uninterrupted run, in the same MLflow run, with no
step logged twice or missing.

Both runs are the same job on the same machine with the same thread count, so they sum in the
same order: the float32 histories must be identical, bit for bit (any difference is the resume
changing the computation, not rounding). The float64 run (``model.dtype=float64``) checks the
same claim to 1e-10, the tolerance of the other exactness tests, which no CPU's rounding reaches.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.conftest import job_threads

# A random tiny model never answers nor stops, so every group's rewards are equal: with a group
# baseline the advantages would be 0 and nothing would train (the resume would be compared on
# frozen weights). REINFORCE without a baseline and the overlong penalty (-1 for every truncated
# completion) give every token an advantage of -1, so the weights move at every step.
ARGS = ["model=tiny", "task=arith", "train.steps=4", "train.prompts_per_step=2", "group_size=4",
        "rollout.max_new_tokens=10", "eval.size=4", "eval.every=2", "checkpoint.every=1",
        "rollout.progress=false", f"train.threads={job_threads()}", "train.lr=1e-3", "task.format_reward=0.5",
        "beta=0.1", "advantage=reinforce", "advantage.baseline=none", "overlong.buffer=9", "overlong.penalty=1.0"]
DETERMINISTIC = ["train/reward_mean", "train/loss", "train/grad_norm", "train/kl", "train/entropy",
                 "train/completion_len_mean", "eval/accuracy", "eval/completion_len_mean", "rollout/logprob_diff_mean"]


# a stale run (harness.train.staleness): the checkpoint holds the behaviour weights and the pending
# versions; with k=2 a kill after step 1 or 2 resumes on the initial weights, after 3 on version 1
STALE = ("rollout.staleness=2", "offpolicy=decoupled", "offpolicy.cap=null")
# overlapped (harness.train.overlap): the killed run had the next step's batch in flight; the resumed one
# collects its first step again from the checkpoint's data position and behaviour weights
OVERLAP = (*STALE, "rollout.overlap=true")


# lora: the checkpoint holds the adapters and their optimizer state only (harness.model.lora)
LORA = ("lora=peft", "lora.r=4", "checkpoint.keep_final=full")


def _cmd(tmp, name, dtype="float32", extra=()):
    return [sys.executable, "-m", "harness.run", *ARGS, *extra, f"model.dtype={dtype}", f"checkpoint.dir={tmp}/{name}/ckpt",
            f"tracking.uri=sqlite:///{tmp}/{name}/mlflow.db", f"hydra.run.dir={tmp}/{name}/out"]


def _histories(tmp, name):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp}/{name}/mlflow.db")
    runs = client.search_runs(experiment_ids=[client.get_experiment_by_name("grpo-harness").experiment_id])
    assert len(runs) == 1, f"{name}: expected one MLflow run, found {len(runs)}"
    run = runs[0]
    return run, {k: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, k),
                                                       key=lambda m: m.step)] for k in DETERMINISTIC}


@pytest.mark.parametrize("dtype, extra", [("float64", ()), pytest.param("float32", (), marks=pytest.mark.exactness),
                                          ("float64", STALE), ("float64", OVERLAP),
                                          ("float64", LORA)],
                         ids=["float64", "float32", "float64-stale", "float64-stale-overlap", "float64-lora"])
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, dtype, extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    subprocess.run(_cmd(tmp_path, "a", dtype, extra), cwd=tmp_path, env=env, check=True, capture_output=True, timeout=600)

    kill_after = random.Random().randint(1, 3)  # a random step between the first and the last
    proc = subprocess.Popen(_cmd(tmp_path, "b", dtype, extra), cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    for line in proc.stdout:
        if f"step_{kill_after:06d}.pt" in line:
            os.kill(proc.pid, signal.SIGKILL)
            break
        assert time.time() < deadline
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"run ended before step {kill_after}"
    resumed = subprocess.run(_cmd(tmp_path, "b", dtype, extra), cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resuming from" in resumed.stdout + resumed.stderr

    run_a, hist_a = _histories(tmp_path, "a")
    run_b, hist_b = _histories(tmp_path, "b")
    assert run_b.info.status == "FINISHED"
    assert [s for s, _ in hist_b["train/reward_mean"]] == [1, 2, 3, 4]  # none twice, none missing
    assert [s for s, _ in hist_b["eval/accuracy"]] == [0, 2, 4]
    assert run_a.data.params["model.dtype"] == dtype
    if extra in (STALE, OVERLAP):  # the stale run was stale: steps 2, 3, 4 sampled with weights 1, 2, 2 updates old
        from mlflow.tracking import MlflowClient
        client = MlflowClient(f"sqlite:///{tmp_path}/b/mlflow.db")
        lags = [m.value for m in sorted(client.get_metric_history(run_b.info.run_id, "rollout/staleness_mean"),
                                        key=lambda m: m.step)]
        assert lags == [0.0, 1.0, 2.0, 2.0], lags
    if extra == LORA:  # the LoRA run's checkpoints hold the adapters only
        assert run_a.data.params["lora.name"] == "peft"
        last = torch.load(sorted((tmp_path / "b" / "ckpt").glob("step_*.pt"))[-1], weights_only=False)
        assert last["policy"] and all(".lora_" in k for k in last["policy"])
        assert len(last["optimizer"]["state"]) == len(last["policy"])  # AdamW moments of the adapters only
    assert min(v for _, v in hist_a["train/grad_norm"]) > 1e-3, "the weights did not move: the comparison is vacuous"
    if dtype == "float32":
        assert hist_a == hist_b
        return
    for k in DETERMINISTIC:
        assert [s for s, _ in hist_b[k]] == [s for s, _ in hist_a[k]], k
        assert [v for _, v in hist_b[k]] == pytest.approx([v for _, v in hist_a[k]], rel=1e-10, abs=1e-12), \
            (k, hist_a[k], hist_b[k])
