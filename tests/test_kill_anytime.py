"""A kill at any moment leaves no orphaned run and no duplicated metric.

Each try starts the job as a user would (``python -m harness.run ...``), SIGKILLs it after a
random delay anywhere in its lifetime (imports, startup, the first eval, a step, a checkpoint
write, a metric flush, the final eval, the shutdown window after the final checkpoint, or after
the process has exited), reruns the same command to completion and compares the MLflow
experiment with an uninterrupted run of the same job: one run, FINISHED, every metric logged
exactly once at the same steps with the same values. A job that finished before the kill (or
whose final checkpoint was written) is rerun too: the rerun reports it and trains nothing. The
window each kill hit is read from what it left behind and printed in the test summary.

``HARNESS_KILL_TRIES`` sets the number of kills (default 6 in the suite: two before the first
checkpoint, one anywhere in the run, one the moment the final checkpoint appears, one at a
random time of the whole lifetime, one after the process exited).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.train.trainer import TIMED_METRICS

ARGS = ["model=tiny", "task=arith", "train.steps=4", "train.prompts_per_step=2", "group_size=4",
        "rollout.max_new_tokens=10", "eval.size=4", "eval.every=2", "checkpoint.every=1",
        "rollout.progress=false", "train.threads=1", "train.lr=1e-3", "task.format_reward=0.5", "beta=0.1"]
REPORT: list[str] = []  # printed by tests/conftest.py's terminal summary


def _cmd(d: Path):
    return [sys.executable, "-m", "harness.run", *ARGS, f"checkpoint.dir={d}/ckpt",
            f"tracking.uri=sqlite:///{d}/mlflow.db", f"hydra.run.dir={d}/out"]


def _env():
    return dict(os.environ, PYTHONUNBUFFERED="1")


def _runs(d: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{d}/mlflow.db")
    exp = client.get_experiment_by_name("grpo-harness")
    return client, (client.search_runs([exp.experiment_id]) if exp else [])


def _history(d: Path) -> dict:
    """``{key: [(step, value), ...]}`` of the experiment's only run, times and speeds excluded."""
    client, runs = _runs(d)
    assert len(runs) == 1, f"expected one MLflow run in the experiment, found {len(runs)}"
    (run,) = runs
    assert run.info.status == "FINISHED", run.info.status
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, k))
            for k in run.data.metrics if not k.startswith(TIMED_METRICS)}


def _window(d: Path) -> str:
    """Where the kill landed, from what it left: the run record, checkpoints, logged metrics."""
    rec = d / "ckpt" / "run.json"
    ckpts = sorted((d / "ckpt").glob("step_*.pt")) if (d / "ckpt").is_dir() else []
    if not rec.exists():
        return "startup (no MLflow run yet)"
    if json.loads(rec.read_text()).get("run_id") is None:
        return "between the run record and the MLflow run"
    _, runs = _runs(d)
    if runs and runs[0].info.status == "FINISHED":
        return "after the run finished (process exit)"
    if ckpts and ckpts[-1].name == "step_000004.pt":
        return "shutdown window (final checkpoint written, run not closed)"
    if not ckpts:
        n = len(runs[0].data.metrics) if runs else 0
        return f"before the first checkpoint ({'step-0 eval logged' if n > 2 else 'no eval logged'})"
    return f"after checkpoint {ckpts[-1].stem}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, and when (seconds after launch) its run record appeared and its
    final checkpoint was written: the span where the MLflow run exists."""
    d = tmp_path_factory.mktemp("reference")
    t0 = time.monotonic()
    proc = subprocess.Popen(_cmd(d), cwd=d, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_record = t_first = t_final = None
    while proc.poll() is None:
        now = time.monotonic() - t0
        if t_record is None and (d / "ckpt" / "run.json").exists():
            t_record = now
        if t_first is None and (d / "ckpt" / "step_000001.pt").exists():
            t_first = now
        if t_final is None and (d / "ckpt" / "step_000004.pt").exists():
            t_final = now
        time.sleep(0.02)
    assert proc.returncode == 0
    wall = time.monotonic() - t0
    t_record = t_record or 0.0
    return _history(d), wall, (t_record, t_first or t_record, t_final or wall)


def test_random_kills_leave_one_run_with_every_metric_once(reference, tmp_path):
    ref, wall, (t_record, t_first, t_final) = reference
    assert [s for s, _ in ref["train/reward_mean"]] == [1, 2, 3, 4]
    assert [s for s, _ in ref["eval/accuracy"]] == [0, 2, 4]
    tries = int(os.environ.get("HARNESS_KILL_TRIES", "6"))
    rng = random.Random(os.environ.get("HARNESS_KILL_SEED"))
    windows = []
    final = Path("ckpt") / "step_000004.pt"
    for i in range(tries):
        d = tmp_path / f"try{i}"
        d.mkdir()
        proc = subprocess.Popen(_cmd(d), cwd=d, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # per six tries: two kills a random time after this try's own run record appears and
        # before its first checkpoint is due, one anywhere in the run, one the moment the final
        # checkpoint appears (the shutdown window: the run is not closed yet), one at a random
        # time of the whole lifetime (up to after the exit), and one after the process exited
        t_launch = time.monotonic()
        kind = i % 6
        if kind == 4:
            delay = rng.uniform(0.2, wall * 1.1)
        elif kind == 5:
            proc.wait(timeout=600)
            delay = time.monotonic() - t_launch
        elif kind == 3:
            while proc.poll() is None and not (d / final).exists():
                time.sleep(0.005)
            delay = time.monotonic() - t_launch
        else:
            span = (t_first - t_record) if kind in (0, 1) else (t_final - t_record + 0.3)
            while proc.poll() is None and not (d / "ckpt" / "run.json").exists() and time.monotonic() - t_launch < 120:
                time.sleep(0.01)
            delay = time.monotonic() - t_launch + rng.uniform(0.0, max(span, 0.05))
        try:
            proc.wait(timeout=max(delay - (time.monotonic() - t_launch), 0.001))
            assert proc.returncode == 0
            windows.append(f"{delay:5.1f} s: finished before the kill")
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
            windows.append(f"{delay:5.1f} s: {_window(d)}")
        done = (d / final).exists()  # the final checkpoint says finished: the rerun reports, trains nothing
        rerun = subprocess.run(_cmd(d), cwd=d, env=_env(), capture_output=True, text=True, timeout=600)
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        assert ("this job is already finished" in rerun.stdout) == done, (windows[-1], rerun.stdout[-2000:])
        got = _history(d)
        assert got.keys() == ref.keys(), (windows[-1], set(got) ^ set(ref))
        for key in ref:
            assert [s for s, _ in got[key]] == [s for s, _ in ref[key]], (windows[-1], key, got[key])
            assert [v for _, v in got[key]] == pytest.approx([v for _, v in ref[key]], rel=1e-6, abs=1e-9), \
                (windows[-1], key)
    early = sum("before the first checkpoint" in w or "between the run record" in w for w in windows)
    late = sum("finished" in w or "shutdown window" in w for w in windows)
    if tries >= 6:
        assert late >= 1, windows  # the try after the exit always finishes first
    REPORT.append(f"{tries} kills, {early} before the first checkpoint, {late} at or after the final checkpoint "
                  f"(uninterrupted run {wall:.1f} s; run record "
                  f"at {t_record:.1f} s, first checkpoint at {t_first:.1f} s, final at {t_final:.1f} s):\n    "
                  + "\n    ".join(windows))


def test_adopting_a_run_created_before_its_id_was_recorded(tmp_path):
    """A kill between creating the MLflow run and writing its id: the record's token finds it."""
    from harness.launch.tracking import Tracker, _write_record

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    record = tmp_path / "ckpt" / "run.json"
    _write_record(record, {"token": "abc", "run_id": None})
    first = Tracker(uri, "grpo-harness")
    orphan = first.start("job", tags={"harness.run_token": "abc"})  # the killed attempt got this far
    first.log_metrics({"eval/accuracy": 0.5}, step=0)
    second = Tracker(uri, "grpo-harness")
    assert second.open(record, "job") == "adopted" and second.run_id == orphan
    assert json.loads(record.read_text()) == {"token": "abc", "run_id": orphan}
    second.log_metrics({"eval/accuracy": 0.25, "eval/format_rate": 1.0}, step=0)  # 0.5 is kept, not doubled
    client, runs = _runs(tmp_path)
    assert [(m.step, m.value) for m in client.get_metric_history(orphan, "eval/accuracy")] == [(0, 0.5)]
    assert len(runs) == 1 and runs[0].data.tags["harness.adopted"] == "1"


def test_a_finished_run_is_never_adopted_and_a_left_over_running_run_is_closed(tmp_path):
    from harness.launch.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    record = tmp_path / "run.json"
    t = Tracker(uri, "grpo-harness")
    assert t.open(record, "job") == "new"
    done = t.run_id
    t.end("FINISHED")
    t2 = Tracker(uri, "grpo-harness")
    # Tracker level (harness.run reports a finished job before it opens a run; resume=never moves run.json aside)
    assert t2.open(record, "job") == "new" and t2.run_id != done
    left = t2.run_id
    t3 = Tracker(uri, "grpo-harness")
    assert t3.open(record, "job", resume_id=done) == "resumed"  # resume= another run's checkpoint
    client, _ = _runs(tmp_path)
    gone = client.get_run(left)
    assert gone.info.status == "KILLED" and gone.data.tags["harness.superseded_by"] == done


def test_a_new_sqlite_store_appears_whole(tmp_path):
    """A kill during MLflow's schema migrations of a brand-new sqlite store must not leave a
    half-built store (seen in a 30-kill run: the rerun failed on '_alembic_tmp_model_versions
    already exists'): the store is built in a temporary file and renamed into place."""
    from harness.launch.tracking import Tracker

    db = tmp_path / "mlflow.db"
    (tmp_path / ".mlflow.db.init-99999").write_bytes(b"half a migration")  # a killed attempt's leftover
    t = Tracker(f"sqlite:///{db}", "grpo-harness")
    assert db.exists() and not list(tmp_path.glob(".mlflow.db.init-*"))
    assert t.client.get_experiment_by_name("grpo-harness") is not None


def test_an_adopted_run_keeps_its_params_and_tags_the_values_this_attempt_differs_in(tmp_path, caplog):
    """The killed attempt logged its params under another commit: MLflow refuses to change a param,
    so the adopting attempt sends only the new keys (one refused batch would lose them all) and
    tags the differing value."""
    from harness.launch.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    record = tmp_path / "ckpt" / "run.json"
    first = Tracker(uri, "grpo-harness")
    assert first.open(record, "job") == "new"
    first.log_params({"lr": 1e-5, "provenance.git.commit": "aaa"})  # then killed before a checkpoint
    second = Tracker(uri, "grpo-harness")
    assert second.open(record, "job") == "adopted" and second.run_id == first.run_id
    with caplog.at_level("INFO", logger="harness.launch.tracking"):
        second.log_params({"lr": 1e-5, "provenance.git.commit": "bbb", "seed": 7})
    assert not [r for r in caplog.records if r.levelname == "WARNING"], caplog.text
    assert "keeps param provenance.git.commit='aaa'" in caplog.text
    _, runs = _runs(tmp_path)
    assert runs[0].data.params == {"lr": "1e-05", "provenance.git.commit": "aaa", "seed": "7"}
    assert runs[0].data.tags["harness.param_now.provenance.git.commit"] == "bbb"
    assert not any(k.startswith("harness.param_now.lr") for k in runs[0].data.tags)
