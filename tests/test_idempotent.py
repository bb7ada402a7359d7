"""Idempotent jobs: the same command after the job finished reports the run and trains nothing.

Each case starts real jobs on the tiny model as a user would (``python -m harness.run ...``,
a Hydra joblib multirun) and reads what the MLflow store and the checkpoint folder hold: the
number of runs, their ids, and the steps of every metric (each logged exactly once).
The 2-rank torchrun case is in ``tests/test_distributed.py``, the sweep case in
``tests/test_sweep.py``, the kills in the shutdown window in ``tests/test_kill_anytime.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.train.trainer import TIMED_METRICS

ARGS = ["model=tiny", "task=arith", "train.prompts_per_step=2", "group_size=4", "rollout.max_new_tokens=10",
        "eval.size=4", "eval.every=2", "checkpoint.every=1", "rollout.progress=false", "train.threads=1",
        "train.lr=1e-3", "task.format_reward=0.5", "beta=0.1"]
TIMED = TIMED_METRICS


def _env() -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _job(d: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "harness.run", *ARGS, f"checkpoint.dir={d}/ckpt",
           f"tracking.uri=sqlite:///{d}/mlflow.db", f"hydra.run.dir={d}/out", *extra]
    proc = subprocess.run(cmd, cwd=d, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _runs(uri: str):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("grpo-harness")
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def _steps(client, run_id: str) -> dict:
    """``{metric: [steps]}`` of one run (sorted; a step logged twice shows twice)."""
    run = client.get_run(run_id)
    return {k: sorted(m.step for m in client.get_metric_history(run_id, k)) for k in run.data.metrics
            if not k.startswith(TIMED)}


def test_rerun_of_a_finished_job_trains_nothing_then_train_longer_and_start_again(tmp_path):
    """Run, the same command again (no run, no metric, exit 0, the report), a lower train.steps
    (the same report), train.steps raised (the same run continues from the final checkpoint),
    then resume=never (a new run; the old checkpoints moved aside, nothing deleted).

    Training longer continues from the final checkpoint's optimizer state, so the job keeps it
    (``checkpoint.keep_final=full``; the default keeps the weights only: tests/test_keep_final.py)."""
    full = "checkpoint.keep_final=full"
    _job(tmp_path, "train.steps=4", full)
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    run_id = runs[0].info.run_id
    before = _steps(client, run_id)
    assert before["train/reward_mean"] == [1, 2, 3, 4] and before["eval/accuracy"] == [0, 2, 4]
    final = tmp_path / "ckpt" / "step_000004.pt"
    stamp = final.stat().st_mtime_ns

    again = _job(tmp_path, "train.steps=4", full)
    out = again.stdout
    assert "this job is already finished; nothing was trained or logged" in out, out[-2000:]
    assert f"MLflow run    : {run_id} (FINISHED" in out and f"final checkpoint {final}" in out
    assert f"outputs       : {tmp_path}/out" in out and "resume=never" in out and "train.steps=<more than 4>" in out
    assert "step 1/4" not in again.stdout + again.stderr  # nothing trained
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    assert _steps(client, run_id) == before
    assert final.stat().st_mtime_ns == stamp

    lower = _job(tmp_path, "train.steps=2", full)  # fewer steps than done: the same report, no truncation
    assert "already finished" in lower.stdout and "steps         : 4 (train.steps=2)" in lower.stdout
    assert _steps(client, run_id) == before

    longer = _job(tmp_path, "train.steps=6", full)
    log = longer.stdout + longer.stderr
    assert "resuming from" in log and "training longer: train.steps 4 -> 6" in log
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert [r.info.run_id for r in runs] == [run_id] and runs[0].info.status == "FINISHED"
    grown = _steps(client, run_id)
    assert grown["train/reward_mean"] == [1, 2, 3, 4, 5, 6] and grown["eval/accuracy"] == [0, 2, 4, 6]
    assert all(v == sorted(set(v)) for v in grown.values()), grown  # every metric once
    assert runs[0].data.tags["harness.extended_from"] == "4" and runs[0].data.tags["harness.train_steps"] == "6"
    assert "already finished" in _job(tmp_path, "train.steps=6", full).stdout

    fresh = _job(tmp_path, "train.steps=4", "resume=never", full)
    assert "resume=never: the job starts again" in fresh.stdout + fresh.stderr
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    assert len(runs) == 2 and runs[0].info.run_id == run_id and runs[1].info.status == "FINISHED"
    assert _steps(client, runs[1].info.run_id)["train/reward_mean"] == [1, 2, 3, 4]
    assert _steps(client, run_id) == grown  # the old run is untouched
    (aside,) = (tmp_path / "ckpt" / "superseded").iterdir()
    assert sorted(p.name for p in aside.iterdir()) == ["run.json", "step_000006.pt"]
    assert [p.name for p in (tmp_path / "ckpt").glob("step_*.pt")] == ["step_000004.pt"]


def test_resubmitted_multirun_reruns_only_the_job_deleted_from_the_store(tmp_path):
    """A joblib multirun of two seeds, then seed 1's MLflow run deleted (MLflow's delete_run, what
    the UI's delete does), then the same multirun command again: seed 0 is reported (same run, its
    metrics once), seed 1 trains again into a new run; its old checkpoints are moved aside."""
    cmd = [sys.executable, "-m", "harness.run", "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
           *ARGS, "train.steps=2", "seed=0,1", f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
           f"hydra.sweep.dir={tmp_path}/multirun"]

    def submit() -> str:
        proc = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    submit()
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    by_seed = {r.data.tags["seed"]: r.info.run_id for r in runs}
    assert sorted(by_seed) == ["0", "1"] and all(r.info.status == "FINISHED" for r in runs)
    kept = _steps(client, by_seed["0"])
    assert kept["train/reward_mean"] == [1, 2]
    client.delete_run(by_seed["1"])

    out = submit()
    assert out.count("this job is already finished") == 1 and by_seed["0"] in out
    client, runs = _runs(f"sqlite:///{tmp_path}/mlflow.db")
    now = {r.data.tags["seed"]: r for r in runs}
    assert len(runs) == 2 and sorted(now) == ["0", "1"]
    assert now["0"].info.run_id == by_seed["0"] and _steps(client, by_seed["0"]) == kept
    assert now["1"].info.run_id != by_seed["1"] and now["1"].info.status == "FINISHED"
    assert _steps(client, now["1"].info.run_id)["train/reward_mean"] == [1, 2]
    assert client.get_run(by_seed["1"]).info.lifecycle_stage == "deleted"
    ck1 = tmp_path / "checkpoints" / now["1"].data.tags["config_key"]
    assert len(list((ck1 / "superseded").iterdir())) == 1


def test_collect_drops_duplicate_runs_of_one_job_and_names_them(run_dir, capsys):
    """Two FINISHED runs of one (config, seed) (what older versions left when a finished job's
    command ran again; here: the job started again in another checkpoint.dir): collect keeps the
    latest, names the other, and keeps both with keep_duplicates."""
    from analysis.collect import collect_runs, save_collection
    from tests.conftest import run_job

    _, old, _ = run_job(f"checkpoint.dir={run_dir}/a")
    _, new, _ = run_job(f"checkpoint.dir={run_dir}/b")
    _, other, _ = run_job(f"checkpoint.dir={run_dir}/c", "seed=1")
    assert old.info.run_id != new.info.run_id and old.data.tags["config_key"] == new.data.tags["config_key"]
    capsys.readouterr()
    coll = collect_runs(os.environ["MLFLOW_TRACKING_URI"])
    out = capsys.readouterr().out
    assert sorted(coll.runs["run_id"]) == sorted([new.info.run_id, other.info.run_id])
    assert f"{old.info.run_id}  duplicates {new.info.run_id}" in out and "1 duplicate run(s)" in out
    assert list(coll.duplicates["run_id"]) == [old.info.run_id]
    assert set(coll.history["run_id"]) == {new.info.run_id, other.info.run_id}
    paths = save_collection(coll, run_dir / "results")
    assert "duplicate_runs" in paths and old.info.run_id in paths["duplicate_runs"].read_text()
    both = collect_runs(os.environ["MLFLOW_TRACKING_URI"], keep_duplicates=True, verbose=False)
    assert len(both.runs) == 3 and len(both.duplicates) == 1


@pytest.mark.parametrize("value", ["never", "auto"])
def test_resume_modes_on_an_empty_folder(run_dir, value):
    """resume=never on a folder with nothing in it just trains; resume=auto there is an error
    naming the folder (it asks for a checkpoint)."""
    from tests.conftest import run_job

    if value == "never":
        _, run, history = run_job(f"checkpoint.dir={run_dir}/e", "resume=never")
        assert [s for s, _ in history("train/reward_mean")] == [1, 2] and run.info.status == "FINISHED"
    else:
        with pytest.raises(FileNotFoundError, match=f"resume='{run_dir}/e'"):
            run_job(f"checkpoint.dir={run_dir}/e", "resume=auto")


def test_a_job_already_running_in_its_folder_is_refused(run_dir):
    """Two processes never train one job at once (the same command started twice, or a concurrent
    multirun over train.steps alone): the second stops naming checkpoint.dir and the holder's pid;
    once the lock is released the job trains."""
    from harness.launch.job import job_lock
    from harness.launch.validate import ConfigError
    from tests.conftest import run_job

    busy = run_dir / "busy"
    with job_lock(busy):
        with pytest.raises(ConfigError, match=f"checkpoint.dir={busy} is in use by another process "
                                              f"\\(pid {os.getpid()}\\)"):
            run_job(f"checkpoint.dir={busy}")
    assert not list(busy.glob("step_*.pt")) and not (busy / "run.json").exists()
    _, run, history = run_job(f"checkpoint.dir={busy}")
    assert [s for s, _ in history("train/reward_mean")] == [1, 2] and run.info.status == "FINISHED"


def test_train_steps_below_an_unfinished_checkpoint_is_refused(run_dir):
    """A job killed after its step-1 checkpoint (here: its final checkpoint removed), rerun with
    train.steps=1: the job is never truncated nor marked finished early; the error names the key
    and the step reached. The same command with train.steps=2 then finishes it in its run."""
    from harness.launch.validate import ConfigError
    from tests.conftest import run_job

    ck = run_dir / "ck"
    # keep_final=full: the finished run keeps its step-1 checkpoint (weights/none delete it at the end)
    args = (f"checkpoint.dir={ck}", "checkpoint.every=1", "checkpoint.keep=2", "checkpoint.keep_final=full")
    _, run, _ = run_job(*args)
    (ck / "step_000002.pt").unlink()
    with pytest.raises(ConfigError, match=r"train.steps=1 is below the step 1 that the job's checkpoint .*step_000001.pt"):
        run_job(*args, "train.steps=1")
    _, again, history = run_job(*args)
    assert again.info.run_id == run.info.run_id and [s for s, _ in history("train/reward_mean")] == [1, 2]
