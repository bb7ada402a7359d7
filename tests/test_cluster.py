"""Sweeps and tracking beyond one machine, against real servers started on 127.0.0.1:

* two sweep workers sharing one Optuna study on PostgreSQL, one of them SIGKILLed mid-trial;
* ``mlflow server --app-name basic-auth`` on PostgreSQL: refused without credentials, two jobs
  logging at once through a server restart (every metric exactly once);
* no password in any record (the MLflow and Optuna databases dumped, artifacts, Hydra's files,
  the logs);
* a multirun through hydra-submitit-launcher's local executor and through hydra-ray-launcher,
  and sweep workers started through submitit and Ray.

Servers that cannot start here skip these tests with the reason, except under ``.ci/run``
(``HARNESS_REQUIRE_SERVERS=1``), which installs PostgreSQL and needs them to run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from servers import MlflowServer, Postgres, Unavailable

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "sweeps" / "smoke.yaml"
PG_PASSWORD = "Pg-4kd9Qz71x"        # the database password: must appear in no record
ADMIN_PASSWORD = "Adm-83jfK2pq0"    # the MLflow server's admin password
QUICK = ["model=tiny", "task=arith", "train.prompts_per_step=2", "group_size=4", "rollout.max_new_tokens=8",
         "eval.size=4", "checkpoint.every=0", "rollout.progress=false", "train.micro_batch_size=4",
         "train.threads=1"]

pytestmark = [pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning"),
              pytest.mark.timeout(900)]


def _unavailable(why: str):
    if os.environ.get("HARNESS_REQUIRE_SERVERS") == "1":
        pytest.fail(f"server needed by CI could not start: {why}")
    pytest.skip(why)


def _need(module: str):
    try:
        __import__(module)
    except ImportError:
        _unavailable(f"{module} is not installed (pip install -e '.[cluster]')")


@pytest.fixture(scope="module")
def pg():
    _need("psycopg")
    root = Path(tempfile.mkdtemp(prefix="harness-pg-"))  # not under pytest's 0700 folders: 'postgres' owns it
    try:
        server = Postgres(root, PG_PASSWORD).start()
    except Unavailable as e:
        shutil.rmtree(root, ignore_errors=True)
        _unavailable(str(e))
    yield server
    server.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def pgpass(pg, tmp_path_factory):
    """A libpq password file (PGPASSFILE), the way a worker gets the password without a URL holding it."""
    f = tmp_path_factory.mktemp("pgpass") / "pgpass"
    f.write_text(f"127.0.0.1:{pg.port}:*:{pg.user}:{PG_PASSWORD}\n")
    f.chmod(0o600)
    return f


@pytest.fixture(scope="module")
def mlflow_server(pg, tmp_path_factory):
    backend, auth = pg.createdb("mlflow"), pg.createdb("mlflow_auth")
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server"), backend, ADMIN_PASSWORD, auth,
                          env={"PGPASSWORD": PG_PASSWORD})
    try:
        server.start()
    except Unavailable as e:
        _unavailable(str(e))
    yield server
    server.stop()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "PGPASSWORD")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1", **extra)
    return env


def _python(*args, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _sweep_file(tmp_path: Path, name: str, **changes) -> Path:
    spec = yaml.safe_load(SMOKE.read_text())
    spec.update(changes)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _load_study(name: str, url: str):
    import optuna

    return optuna.load_study(study_name=name, storage=url)


# --------------------------------------------------------------------------- PostgreSQL study


def test_two_workers_share_a_postgres_study_and_retry_a_killed_workers_trial(pg, pgpass, tmp_path, monkeypatch):
    from optuna.trial import TrialState

    url = pg.createdb("optuna")
    assert PG_PASSWORD not in url
    monkeypatch.setenv("PGPASSFILE", str(pgpass))  # for this process's own look at the study
    n = 4
    sweep = _sweep_file(tmp_path, "pg2", study_name="pg2", n_trials=n, pruner={"type": "none"},
                        heartbeat={"interval": 1, "grace_period": 3, "max_retry": 1},
                        overrides=[*yaml.safe_load(SMOKE.read_text())["overrides"], "train.steps=6",
                                   "train.threads=1"])
    env = _env(PGPASSFILE=str(pgpass), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db")
    cmd = [sys.executable, "-m", "harness.sweep", str(sweep), "--storage", url]
    t0 = time.time()
    doomed = subprocess.Popen([*cmd, "--seed", "0"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 300
    running = None
    while time.time() < deadline and running is None:
        time.sleep(0.5)
        assert doomed.poll() is None, doomed.stdout.read().decode()[-3000:]
        try:
            trials = _load_study("pg2", url).get_trials(deepcopy=False)
        except KeyError:  # the worker has not created the study yet
            continue
        running = next((t for t in trials if t.state == TrialState.RUNNING and t.params), None)
    assert running is not None, "the first worker never started a trial"
    time.sleep(1.5)  # mid-trial
    os.killpg(doomed.pid, signal.SIGKILL)
    doomed.wait()
    t_kill = time.time() - t0
    workers = [subprocess.Popen([*cmd, "--seed", str(s)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for s in (1, 2)]
    outs = [w.communicate(timeout=600)[0] for w in workers]
    t_all = time.time() - t0
    for w, out in zip(workers, outs):
        assert w.returncode == 0, out[-3000:]

    trials = _load_study("pg2", url).trials
    states = [t.state for t in trials]
    finished = [t for t in trials if t.state == TrialState.COMPLETE]
    assert len(finished) == n, states  # no trial lost, none extra
    assert states.count(TrialState.FAIL) == 1 and trials[running.number].state == TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == running.number]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE and retries[0].params == running.params
    # each finished trial is a different one: distinct parameters, one MLflow run each
    assert len({json.dumps(t.params, sort_keys=True) for t in finished}) == n
    assert len({t.user_attrs["mlflow_run_id"] for t in finished}) == n
    # both surviving workers ran trials (the study was shared, not run twice)
    assert all("Trial" in out and "finished with value" in out for out in outs), outs
    print(f"\n2-worker PostgreSQL study: {n} COMPLETE + 1 FAIL (killed at {t_kill:.1f} s, retried), "
          f"{len(trials)} trials in all, {t_all:.1f} s wall")


# --------------------------------------------------------------------------- MLflow server


def test_mlflow_server_refuses_a_client_without_credentials(mlflow_server, tmp_path):
    args = ["-m", "harness.run", *QUICK, "train.steps=1", "eval.every=1", f"tracking.uri={mlflow_server.uri}"]
    r = _python(*args, cwd=tmp_path, env=_env())
    assert r.returncode == 2, r.stderr[-2000:]
    assert "refused the credentials" in r.stderr and "MLFLOW_TRACKING_USERNAME" in r.stderr
    assert "Traceback" not in r.stderr
    r = _python(*args, cwd=tmp_path, env=_env(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD="wrong-pw"))
    assert r.returncode == 2 and "refused the credentials" in r.stderr
    ok = _python(*args, cwd=tmp_path, env=_env(MLFLOW_TRACKING_USERNAME="admin",
                                               MLFLOW_TRACKING_PASSWORD=ADMIN_PASSWORD))
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert "wrong-pw" not in ok.stdout + ok.stderr


def _server_client(server, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    return MlflowClient(server.uri)


def test_two_jobs_log_through_a_server_restart_exactly_once(mlflow_server, tmp_path, monkeypatch):
    client = _server_client(mlflow_server, monkeypatch)
    steps = 40
    env = _env(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=ADMIN_PASSWORD)
    jobs = [subprocess.Popen([sys.executable, "-m", "harness.run", *QUICK, f"train.steps={steps}", "eval.every=10",
                              f"seed={s}", f"tracking.uri={mlflow_server.uri}", "tracking.experiment=restart",
                              f"tracking.run_name=restart-s{s}"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for s in (0, 1)]

    def progress() -> list[int]:
        exp = client.get_experiment_by_name("restart")
        if exp is None:
            return []
        runs = client.search_runs([exp.experiment_id])
        return [len(client.get_metric_history(r.info.run_id, "train/reward_mean")) for r in runs]

    deadline = time.time() + 300
    while time.time() < deadline:
        done = progress()
        if len(done) == 2 and min(done) >= 3:
            break
        assert all(j.poll() is None for j in jobs), [j.communicate()[0][-2000:] for j in jobs]
        time.sleep(0.5)
    else:
        pytest.fail("the jobs never logged 3 steps")
    t0 = time.time()
    mlflow_server.stop()  # the server goes away mid-run ...
    time.sleep(3)
    mlflow_server.start()  # ... and comes back on the same port
    t_down = time.time() - t0
    outs = [j.communicate(timeout=600)[0] for j in jobs]
    print(f"\nserver down {t_down:.1f} s; jobs done {time.time() - t0:.1f} s after it went down")
    for j, out in zip(jobs, outs):
        assert j.returncode == 0, out[-3000:]
    assert any("buffered" in out for out in outs), "no job saw the server gone: the restart came too late"

    exp = client.get_experiment_by_name("restart")
    runs = client.search_runs([exp.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["restart-s0", "restart-s1"]
    for r in runs:
        assert r.info.status == "FINISHED"
        for key in r.data.metrics:
            hist = [m.step for m in client.get_metric_history(r.info.run_id, key)]
            assert len(hist) == len(set(hist)), f"{r.info.run_name} {key}: a step logged twice: {sorted(hist)}"
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "train/reward_mean")) == \
            list(range(1, steps + 1))
        assert sorted(m.step for m in client.get_metric_history(r.info.run_id, "eval/accuracy")) == [0, 10, 20, 30, 40]

    # the analysis reads the server like any store
    r = _python("-m", "analysis.collect", "--tracking-uri", mlflow_server.uri, "--experiment", "restart",
                "--out", str(tmp_path / "results"), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    import pandas as pd

    hist = pd.read_csv(tmp_path / "results" / "history.csv")
    per_run = hist[hist.key == "train/reward_mean"].groupby("run_id").step.apply(sorted)
    assert [list(v) for v in per_run] == [list(range(1, steps + 1))] * 2


def test_a_killed_job_resumes_into_the_same_server_run(mlflow_server, tmp_path, monkeypatch):
    """SIGKILL after a checkpoint, the same command again: one FINISHED run on the server with every
    (metric, step) exactly once (the resume path of tests/test_kill_anytime.py, against a server)."""
    client = _server_client(mlflow_server, monkeypatch)
    steps = 8
    env = _env(MLFLOW_TRACKING_USERNAME="admin", MLFLOW_TRACKING_PASSWORD=ADMIN_PASSWORD)
    cmd = [sys.executable, "-m", "harness.run", *QUICK, f"train.steps={steps}", "eval.every=4", "checkpoint.every=1",
           f"tracking.uri={mlflow_server.uri}", "tracking.experiment=resume", "tracking.run_name=resume-me"]
    job = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        if len(list(tmp_path.glob("checkpoints/*/step_000003.pt"))):
            break
        assert job.poll() is None, job.stdout.read().decode()[-3000:]
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert not list(tmp_path.glob(f"checkpoints/*/step_{steps:06d}.pt")), "the job finished before the kill"
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from" in r.stdout + r.stderr
    runs = client.search_runs([client.get_experiment_by_name("resume").experiment_id])
    assert [x.info.run_name for x in runs] == ["resume-me"] and runs[0].info.status == "FINISHED"
    run = runs[0]
    for key in run.data.metrics:
        hist = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(hist) == len(set(hist)), f"{key}: a step logged twice: {sorted(hist)}"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train/reward_mean")) == \
        list(range(1, steps + 1))
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "eval/accuracy")) == [0, 4, 8]


# --------------------------------------------------------------------------- no secret in the records


def test_no_password_in_any_record(pg, mlflow_server, tmp_path, monkeypatch):
    """The worst case: the password written into both URLs on the command line. It works, and it is
    in none of: the MLflow database, the Optuna database, the artifacts, Hydra's files, the logs."""
    store = pg.url("mlflow", with_password=True)  # the server's backend, used directly as a store
    storage = pg.url(pg.createdb("optuna_secret").rsplit("/", 1)[1], with_password=True)
    assert PG_PASSWORD in store and PG_PASSWORD in storage
    env = _env()
    sweep = _sweep_file(tmp_path, "secret", study_name="secret", n_trials=1)
    r1 = _python("-m", "harness.sweep", str(sweep), "--storage", storage, f"tracking.uri={store}",
                 "tracking.experiment=secret", "train.threads=1", cwd=tmp_path, env=env)
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = _python("-m", "harness.run", "-m", *QUICK, "train.steps=1", "eval.every=1", "seed=5",
                 f"tracking.uri={store}", "tracking.experiment=secret", cwd=tmp_path, env=env)
    assert r2.returncode == 0, r2.stderr[-3000:]
    logs = r1.stdout + r1.stderr + r2.stdout + r2.stderr
    assert "carries a password" in logs  # the user was told to use PGPASSWORD / ~/.pgpass

    # the password worked: both runs and the trial are in the PostgreSQL stores
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("PGPASSWORD", PG_PASSWORD)
    client = MlflowClient(pg.url("mlflow"))
    runs = client.search_runs([client.get_experiment_by_name("secret").experiment_id])
    assert len(runs) == 2 and all(r.info.status == "FINISHED" for r in runs)
    masked = f"postgresql://{pg.user}:***@127.0.0.1:{pg.port}/mlflow"
    assert {r.data.params["tracking.uri"] for r in runs} == {masked}
    assert all(PG_PASSWORD not in r.data.tags["mlflow.note.content"] and "***" in r.data.tags["mlflow.note.content"]
               for r in runs)
    study = _load_study("secret", pg.url("optuna_secret"))
    assert len(study.trials) == 1 and study.trials[0].value is not None

    dump = subprocess.run([str(pg.bindir / "pg_dumpall"), "-h", "127.0.0.1", "-p", str(pg.port), "-U", pg.user],
                          capture_output=True, text=True, env={**os.environ, "PGPASSWORD": PG_PASSWORD}, timeout=120)
    assert dump.returncode == 0, dump.stderr
    assert "secret-trial0" in dump.stdout and masked in dump.stdout  # the records are in the dump
    assert PG_PASSWORD not in dump.stdout
    assert PG_PASSWORD not in logs, [line for line in logs.splitlines() if PG_PASSWORD in line]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "multirun.yaml" for p in files) and any(p.name == "resolved.yaml" for p in files)
    assert any(p.name == "overrides.yaml" for p in files)
    leaked = [str(p) for p in files if PG_PASSWORD.encode() in p.read_bytes()]
    assert not leaked, leaked
    assert not [str(p) for p in tmp_path.rglob("*") if PG_PASSWORD in str(p)]  # nor in a folder name


# --------------------------------------------------------------------------- launchers


def _runs(uri: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("grpo-harness")
    return client.search_runs([exp.experiment_id]) if exp else []


@pytest.mark.parametrize("launcher", ["submitit_local", "ray_local"])
def test_multirun_through_a_launcher(launcher, tmp_path):
    _need("submitit" if launcher.startswith("submitit") else "ray")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    r = _python("-m", "harness.run", "-m", f"hydra/launcher={launcher}", *QUICK, "train.steps=2", "eval.every=1",
                "seed=0,1", cwd=tmp_path, env=_env(MLFLOW_TRACKING_URI=uri))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    runs = _runs(uri)
    assert sorted(r.data.params["seed"] for r in runs) == ["0", "1"]
    assert all(r.info.status == "FINISHED" for r in runs)
    pids = {r.data.tags["harness.pid"] for r in runs}
    assert len(pids) == 2  # each job in a process of its own, started by the engine
    if launcher.startswith("submitit"):
        folders = list(tmp_path.glob("multirun/*/*/.submitit/*"))
        assert len([f for f in folders if list(f.glob("*_result.pkl"))]) == 2, folders
    else:
        assert "(_run_job pid=" in r.stdout + r.stderr  # Ray's task log prefix


@pytest.mark.parametrize("launcher", ["submitit_local", "ray"])
def test_sweep_workers_through_a_launcher_share_the_postgres_study(launcher, pg, pgpass, tmp_path, monkeypatch):
    from optuna.trial import TrialState

    _need("submitit" if launcher.startswith("submitit") else "ray")
    url = pg.createdb(f"optuna_{launcher}")
    monkeypatch.setenv("PGPASSFILE", str(pgpass))
    sweep = _sweep_file(tmp_path, "w", study_name=f"workers-{launcher}", n_trials=3)
    r = _python("-m", "harness.sweep", str(sweep), "--storage", url, "train.threads=1", "--workers", "2",
                "--launcher", launcher, cwd=tmp_path,
                env=_env(PGPASSFILE=str(pgpass), MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/mlflow.db"))
    out = r.stdout + r.stderr
    assert r.returncode == 0, (r.returncode, [line for line in out.splitlines() if "_worker pid" not in line][-40:])
    assert "sweep workers finished with exit statuses [0, 0]" in out and "3 complete, 0 pruned, 0 failed" in out
    trials = _load_study(f"workers-{launcher}", url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    pids = {r.data.tags["harness.pid"] for r in _runs(f"sqlite:///{tmp_path}/mlflow.db")}
    assert len(pids) == 2  # two worker processes shared the three trials
