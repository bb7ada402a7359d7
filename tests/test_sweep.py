"""Optuna sweep driver (harness.sweep): real tiny-model trials, resume, a killed worker's
stale trial, pruning, group overrides and bad sweep files."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta, timezone
from pathlib import Path

import optuna
import pytest
import yaml

from harness.launch import sweep as sw

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "sweeps" / "smoke.yaml"


@pytest.fixture
def sweep_dir(tmp_path, monkeypatch):
    """Run sweeps in a temp dir: optuna.db, mlflow.db and checkpoints/ land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


def _study(tmp_path, name="smoke"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path}/optuna.db")


def _write(tmp_path, name: str, **changes) -> str:
    spec = yaml.safe_load(SMOKE.read_text())
    for k, v in changes.items():
        if v is None:
            spec.pop(k, None)
        else:
            spec[k] = v
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning",
                            "ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_smoke_sweep_resume_and_killed_worker(sweep_dir, capsys):
    from mlflow.tracking import MlflowClient

    from optuna.trial import TrialState

    argv = [str(SMOKE), "train.threads=1"]
    assert sw.main(argv) == 0
    study = _study(sweep_dir)
    trials = study.trials
    first = [(t.number, t.datetime_start, t.value) for t in trials]
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    client = MlflowClient(f"sqlite:///{sweep_dir}/mlflow.db")
    for t in trials:
        assert t.value is not None and 0.0 <= t.value <= 1.0
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.data.tags["sweep"] == "smoke" and run.info.run_name == f"smoke-trial{t.number}"
        assert run.info.status == "FINISHED"
        assert run.data.params["train.lr"] == repr(t.params["train.lr"])
        assert sorted(t.intermediate_values) == [0, 1, 2]  # reported after every eval
    out = capsys.readouterr().out
    assert "2 complete, 0 pruned, 0 failed" in out and f"optuna-dashboard sqlite:///{sweep_dir}/optuna.db" in out

    # Resume: the same command with n_trials 3 runs only the one missing trial.
    assert sw.main(argv + ["--n-trials", "3"]) == 0
    trials = _study(sweep_dir).trials
    assert len(trials) == 3 and trials[2].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert [(t.number, t.datetime_start, t.value) for t in trials[:2]] == first  # untouched
    assert trials[2].params != trials[0].params  # the resumed sampler does not replay trial 0

    # A worker killed with SIGKILL leaves its trial RUNNING with a heartbeat that stops.
    storage = optuna.storages.RDBStorage(f"sqlite:///{sweep_dir}/optuna.db", heartbeat_interval=60)
    dead = optuna.load_study(study_name="smoke", storage=storage).ask()
    dead.suggest_float("train.lr", 1e-5, 1e-3, log=True)
    dead.suggest_float("beta", 0.0, 0.1)
    storage.record_heartbeat(dead._trial_id)
    old = (datetime.now(timezone.utc) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S.%f")
    with sqlite3.connect(sweep_dir / "optuna.db") as db:
        assert db.execute("UPDATE trial_heartbeats SET heartbeat = ? WHERE trial_id = ?",
                          (old, dead._trial_id)).rowcount == 1
    assert _study(sweep_dir).trials[3].state == TrialState.RUNNING

    assert sw.main(argv + ["--n-trials", "4"]) == 0
    trials = _study(sweep_dir).trials
    assert trials[3].state == TrialState.FAIL  # the dead worker's trial
    retry = trials[4]
    assert retry.system_attrs["failed_trial"] == 3 and retry.params == dead.params
    assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED) and len(trials) == 5
    assert client.get_run(retry.user_attrs["mlflow_run_id"]).info.run_name == "smoke-trial3"
    finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert len(finished) == 4
    # Nothing left to do: a rerun starts no trial.
    assert sw.main(argv + ["--n-trials", "4"]) == 0
    assert len(_study(sweep_dir).trials) == 5


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_a_resubmitted_sweep_does_not_train_a_finished_trial_again(sweep_dir, monkeypatch, capsys):
    """Ctrl-C / SIGTERM (preemption) lands after a trial's job finished but before Optuna recorded
    the trial: it is FAIL and queued for a retry. The re-submitted sweep retries it in the same
    trial folder, where the job reports its finished run instead of training again: one MLflow
    run, every metric once, the retry COMPLETE with that run's final eval accuracy."""
    from mlflow.tracking import MlflowClient
    from optuna.trial import TrialState

    real = sw.train  # harness.launch.run.train, imported by harness.sweep

    def train_then_interrupted(cfg, on_eval=None):
        real(cfg, on_eval=on_eval)
        raise KeyboardInterrupt("SIGTERM")

    monkeypatch.setattr(sw, "train", train_then_interrupted)
    path = _write(sweep_dir, "one.yaml", n_trials=1, study_name="one")
    assert sw.main([path, "train.threads=1"]) == 130
    assert [t.state for t in _study(sweep_dir, "one").trials] == [TrialState.FAIL, TrialState.WAITING]
    monkeypatch.setattr(sw, "train", real)
    capsys.readouterr()
    assert sw.main([path, "train.threads=1"]) == 0
    assert "this job is already finished; nothing was trained or logged" in capsys.readouterr().out
    trials = _study(sweep_dir, "one").trials
    assert len(trials) == 2 and trials[1].state == TrialState.COMPLETE and trials[1].system_attrs["failed_trial"] == 0
    client = MlflowClient(f"sqlite:///{sweep_dir}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])
    assert run.info.run_name == "one-trial0" and run.info.status == "FINISHED"
    assert trials[1].value == run.data.metrics["eval/accuracy"]
    assert trials[1].user_attrs["mlflow_run_id"] == run.info.run_id
    for key in run.data.metrics:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, key))
        assert steps == sorted(set(steps)), (key, steps)
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/reward_mean")) == [1, 2]


def test_pruned_trials_count_and_metric_is_configurable(sweep_dir, monkeypatch, capsys):
    """A stub train: trials 0-1 score 1.0 at every eval, later ones 0.0 -> pruned at step 1."""
    from optuna.trial import TrialState

    calls = []

    def fake_train(cfg, on_eval=None):
        n = len(calls)
        calls.append(cfg)
        value = 1.0 if n < 2 else 0.0
        for step in range(4):
            on_eval(step, {"eval/accuracy": value, "eval/format_rate": 1.0 - value})
        return value

    monkeypatch.setattr(sw, "train", fake_train)
    path = _write(sweep_dir, "prune.yaml", n_trials=3, study_name="prune",
                  pruner={"type": "median", "n_startup_trials": 2, "n_warmup_steps": 1})
    assert sw.main([path]) == 0
    trials = _study(sweep_dir, "prune").trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED]
    assert sorted(trials[2].intermediate_values) == [0, 1]
    assert "2 complete, 1 pruned, 0 failed" in capsys.readouterr().out
    cfg = calls[0]
    assert cfg.tracking.sweep == "prune" and cfg.tracking.run_name == "prune-trial0"
    assert cfg.checkpoint.dir.startswith(str(sweep_dir / "checkpoints" / "sweeps" / "prune" / "trial0-"))
    assert cfg.train.lr == trials[0].params["train.lr"] and cfg.model.tiny_config is not None

    # metric: eval/format_rate (minimized); a metric no eval reports stops the sweep (exit 2).
    path = _write(sweep_dir, "fmt.yaml", study_name="fmt", metric="eval/format_rate", direction="minimize",
                  pruner="none")
    calls.clear()
    assert sw.main([path]) == 0
    assert [t.value for t in _study(sweep_dir, "fmt").trials] == [0.0, 0.0]
    # the objective is named after the metric (optuna-dashboard shows "Objective 0" without it)
    assert _study(sweep_dir, "prune").metric_names == ["eval/accuracy"]
    assert _study(sweep_dir, "fmt").metric_names == ["eval/format_rate"]
    path = _write(sweep_dir, "nope.yaml", study_name="nope", metric="eval/nope")
    assert sw.main([path]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml: metric: 'eval/nope'" in err and "eval/accuracy" in err


def test_group_option_as_categorical_param(sweep_dir):
    spec = sw.load_sweep(ROOT / "sweeps" / "arith_group_size_per_estimator.yaml")
    assert spec.sampler["type"] == "grid" and {p.name for p in spec.params} == {"group_size", "advantage"}
    sw.preflight(spec, spec.overrides)  # composes and validates every choice
    cfg = sw.compose(sw.merge_overrides(spec.overrides, ["advantage=rloo", "group_size=16"]))
    assert cfg.advantage.name == "rloo" and cfg.group_size == 16 and cfg.task.name == "arith"
    assert sw.compose(["advantage=mean_only"]).advantage.name == "mean_only"
    spec = sw.load_sweep(ROOT / "sweeps" / "arith_grpo_lr_eps_beta.yaml")
    assert [p.name for p in spec.params] == ["train.lr", "policy_loss.epsilon", "beta"] and spec.params[0].log
    sw.preflight(spec, spec.overrides)


@pytest.mark.parametrize("changes, key", [
    ({"n_trials": None}, "n_trials: missing required key"),
    ({"params": {"train.lr": {"type": "floaty", "low": 1e-5, "high": 1e-3}}}, "params.train.lr.type: unknown type"),
    ({"params": {"beta": {"type": "float", "low": 0.0}}}, "params.beta.high: missing required key"),
    ({"params": {"advantage": {"type": "categorical", "choices": []}}}, "params.advantage.choices"),
    ({"pruner": {"type": "hyperband"}}, "pruner.type: unknown pruner"),
    ({"overide": ["x=1"]}, "overide: unknown key"),
    ({"params": {"no_such_key": {"type": "int", "low": 1, "high": 2}}}, "params.no_such_key:"),
    ({"params": {"advantage": {"type": "categorical", "choices": ["grpo", "nope"]}}}, "params.advantage:"),
])
def test_bad_sweep_file_exits_2_naming_the_key(sweep_dir, capsys, changes, key):
    path = _write(sweep_dir, "bad.yaml", **changes)
    assert sw.main([path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: {key}") and "\n" not in err
    assert not (sweep_dir / "optuna.db").exists()  # nothing was created


def test_missing_sweep_file_and_bad_override(sweep_dir, capsys):
    assert sw.main([str(sweep_dir / "missing.yaml")]) == 2
    assert "missing.yaml: no such sweep file" in capsys.readouterr().err
    assert sw.main([str(SMOKE), "train.lr"]) == 2
    assert "'train.lr' is not a key=value override" in capsys.readouterr().err
    assert sw.main([str(SMOKE), "beta=0.1"]) == 2
    assert "params.beta: also set on the command line" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_killed_sweep_worker_trial_retry_adopts_its_mlflow_run(sweep_dir):
    """A real sweep worker SIGKILLed after its trial's MLflow run exists: the retry (same trial
    checkpoint folder, hence the same run record) continues that run; the experiment ends with
    one FINISHED run for the trial, every metric once."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    path = _write(sweep_dir, "kill.yaml", study_name="kill", n_trials=1, pruner="none",
                  heartbeat={"interval": 1, "grace_period": 2, "max_retry": 2},
                  overrides=yaml.safe_load(SMOKE.read_text())["overrides"] + ["train.steps=4", "eval.every=2",
                                                                                "checkpoint.every=1"])
    cmd = [sys.executable, "-m", "harness.sweep", path, "train.threads=1"]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=sweep_dir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import json

    db, deadline = sweep_dir / "mlflow.db", time.time() + 300
    client = None
    while True:  # wait until the trial's MLflow run holds its step-0 eval, then kill
        assert proc.poll() is None and time.time() < deadline, "the sweep ended before it could be killed"
        recs = list((sweep_dir / "checkpoints" / "sweeps" / "kill").glob("trial0-*/run.json"))
        if recs and json.loads(recs[0].read_text()).get("run_id"):  # the store exists once a run does
            client = client or MlflowClient(f"sqlite:///{db}")
            killed = json.loads(recs[0].read_text())["run_id"]
            if "eval/accuracy" in client.get_run(killed).data.metrics:
                exp = client.get_experiment_by_name("grpo-harness")
                break
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    time.sleep(3)  # past the heartbeat grace period: the next worker retries the trial
    done = subprocess.run(cmd, cwd=sweep_dir, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    runs = client.search_runs([exp.experiment_id])
    assert [r.info.run_id for r in runs] == [killed] and runs[0].info.status == "FINISHED"
    for key in ("eval/accuracy", "train/reward_mean", "train/loss"):
        steps = [m.step for m in client.get_metric_history(killed, key)]
        assert sorted(steps) == sorted(set(steps)) and len(steps) == (3 if key.startswith("eval") else 4), (key, steps)
    trials = _study(sweep_dir, "kill").trials
    assert trials[-1].user_attrs["mlflow_run_id"] == killed
