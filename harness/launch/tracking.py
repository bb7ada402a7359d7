"""MLflow tracking: one run per job, metrics buffered so a flaky server never kills training."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import socket
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from harness.launch.credentials import redact, redact_obj
from harness.errors import ConfigError

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///mlflow.db"
END_FLUSH_S = 180.0  # how long the end of a run waits for an unreachable server to take its buffered metrics


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; the message names the URI."""


def resolve_uri(configured: str | None) -> str:
    """``tracking.uri`` if set, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` (cwd)."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def _short(e: Exception) -> str:
    return " ".join(str(e).split())[:400]


def _auth_hint(e: Exception) -> str:
    """A pointer to the credentials when a server answered 401/403."""
    text = str(e)
    if any(s in text for s in ("401", "403", "Unauthorized", "Permission denied", "PERMISSION_DENIED",
                               "UNAUTHENTICATED")):
        return ("; the server refused the credentials: set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or ~/.mlflow/credentials) to an account with access")
    return ""


def flatten(d: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are kept as their string form)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _artifact_location(uri: str) -> str | None:
    """For a sqlite store, artifacts go to ``mlartifacts/`` beside the database file (not ./mlruns)."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts").as_uri()
    return None


@contextlib.contextmanager
def _store_lock(uri: str):
    """An exclusive file lock beside a sqlite store while it is opened (no-op for other URIs)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    with open(uri[len("sqlite:///"):] + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _create_sqlite_store(db: Path) -> None:
    """Create a new sqlite store atomically: MLflow's schema migrations run on a temporary file
    that is renamed into place once complete, so a process killed mid-migration leaves no
    half-built store behind (a rerun would fail on ``_alembic_tmp_*`` tables). Call under
    :func:`_store_lock`; left-over temporary files of killed attempts are removed first."""
    for old in db.parent.glob(f".{db.name}.init-*"):
        old.unlink(missing_ok=True)
    tmp = db.with_name(f".{db.name}.init-{os.getpid()}")
    MlflowClient(f"sqlite:///{tmp}").search_experiments(max_results=1)  # runs every migration
    os.replace(tmp, db)


class Tracker:
    """Wraps ``MlflowClient`` for one run. Params, tags and text artifacts pass through
    :func:`harness.launch.credentials.redact` (no password reaches the store), and error messages name
    the URI with its password masked.

    Args:
        uri: tracking URI (sqlite URL, http(s) server, ...).
        experiment: experiment name (created if missing).
    Raises:
        TrackingError: the store is unreachable or rejects the experiment (before any compute).

    Call :meth:`start` to create (or reopen) the run.
    """

    def __init__(self, uri: str, experiment: str):
        self.uri = uri
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            if not db.parent.is_dir():
                raise TrackingError(f"tracking store {redact(uri)!r}: folder {str(db.parent)!r} does not exist; "
                                    "create it or set tracking.uri / MLFLOW_TRACKING_URI to another sqlite path")
        mlflow.set_tracking_uri(uri)
        if uri.startswith("http"):  # fail fast instead of MLflow's long retry loop
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        with _store_lock(uri):  # parallel jobs must not create one new sqlite store's tables twice
            try:
                if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
                    _create_sqlite_store(Path(uri[len("sqlite:///"):]))
                self.client = MlflowClient(uri)
                self.experiment_id = self._experiment(experiment)
            except Exception as e:
                raise TrackingError(redact(
                    f"tracking store {uri!r} is not usable ({type(e).__name__}: {_short(e)}){_auth_hint(e)}; "
                    "set tracking.uri=... or MLFLOW_TRACKING_URI to a reachable server or a sqlite URL like "
                    "sqlite:///mlflow.db")) from e
        self.run_id: str | None = None
        self.pending: list = []
        self.logged: set[tuple[str, int]] = set()  # (key, step) already in the store: never sent twice
        self.held_params: dict[str, str] = {}  # the params a reopened run already holds (MLflow cannot change one)
        self._beat = 0.0
        self._system = None

    def _experiment(self, name: str) -> str:
        """The id of experiment ``name``, created if missing. Jobs starting together against one
        server race to create it: the loser finds the winner's (RESOURCE_ALREADY_EXISTS)."""
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        try:  # a model-training experiment: the MLflow UI opens its runs table, not the GenAI view
            return self.client.create_experiment(name, artifact_location=_artifact_location(self.uri),
                                                 tags={"mlflow.experimentKind": "custom_model_development"})
        except Exception:
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def start(self, run_name: str | None = None, run_id: str | None = None, tags: dict | None = None) -> str:
        """Create a run (with ``tags`` set at creation), or reopen ``run_id``; returns the run id.

        Reopening loads the ``(key, step)`` pairs the run already holds, so nothing is sent twice.

        Raises:
            TrackingError: the run cannot be created or ``run_id`` does not exist.
        """
        identity = {"harness.host": socket.gethostname(), "harness.pid": str(os.getpid()),
                    "harness.heartbeat": str(int(time.time()))}
        try:
            if run_id:
                run = self.client.get_run(run_id)
                self.run_id = run.info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
                self.set_tags({**identity, **(tags or {})})
                self.logged = {(key, m.step) for key in run.data.metrics
                               for m in self.client.get_metric_history(self.run_id, key)}
                self.held_params = dict(run.data.params)
            else:
                self.run_id = self.client.create_run(self.experiment_id, run_name=run_name,
                                                     tags={**identity, **(tags or {})}).info.run_id
                self.logged = set()
                self.held_params = {}
        except Exception as e:
            raise TrackingError(redact(f"tracking store {self.uri!r}: cannot open run {run_id or 'new'}: {_short(e)}"
                                       f"{_auth_hint(e)}")) from e
        return self.run_id

    def open(self, record_path: str | Path, run_name: str | None = None, resume_id: str | None = None,
             tags: dict | None = None, config_key: str | None = None) -> str:
        """Open the run of one job so that a rerun of the same command finds it again, from the start.

        ``record_path`` (``run.json`` in the job's checkpoint folder) is written atomically
        *before* the MLflow run is created (a fresh token, also set as the run's
        ``harness.run_token`` tag at creation) and again once the run id is known, so a kill at
        any moment leaves a record that leads back to the run:

        * ``resume_id`` (the run a checkpoint names) is reopened: ``"resumed"``;
        * else a recorded run (by id, or by token when the kill came before the id was written)
          that is not FINISHED (nor deleted) is reopened: ``"adopted"``; the job restarts from its
          beginning and whatever the run already holds is not sent again;
        * else a new run is created: ``"new"`` (a finished run is never adopted: a finished job
          is reported by :func:`harness.launch.job.plan_job` before a run is opened).

        A recorded run that is left behind while still RUNNING is closed as KILLED with the tag
        ``harness.superseded_by``. Returns ``"new"``, ``"adopted"`` or ``"resumed"``.

        ``config_key`` (:func:`harness.launch.job.config_key`) is written into the record; a record of
        another key (another config's job writes into the same folder) is never adopted.

        Raises:
            TrackingError: the store rejects the run.
            ConfigError: the record belongs to a job of another config and no ``resume_id`` is given.
        """
        record_path = Path(record_path)
        rec = _read_record(record_path)
        key = {"config_key": config_key} if config_key else {}
        if not resume_id and config_key and rec and rec.get("config_key") not in (None, config_key):
            raise ConfigError(shared_folder_message(record_path.parent, rec["config_key"], config_key))
        recorded = self._recorded_run(rec)
        how, token = "new", uuid.uuid4().hex
        if resume_id:
            self.start(run_name, run_id=resume_id, tags=tags)
            how = "resumed"
        elif recorded is not None and recorded.info.status != "FINISHED":
            adopted = int(recorded.data.tags.get("harness.adopted", "0")) + 1
            self.start(run_name, run_id=recorded.info.run_id, tags={**(tags or {}), "harness.adopted": str(adopted)})
            log.info("adopting MLflow run %s of a killed attempt (no checkpoint yet)", self.run_id)
            how = "adopted"
        else:
            _write_record(record_path, {"token": token, "run_id": None, **key})
            self.start(run_name, tags={**(tags or {}), "harness.run_token": token})
        if how != "new":
            token = (rec or {}).get("token") or token
        _write_record(record_path, {"token": token, "run_id": self.run_id, **key})
        if recorded is not None and recorded.info.run_id != self.run_id and recorded.info.status == "RUNNING":
            self._call(self.client.set_tag, recorded.info.run_id, "harness.superseded_by", self.run_id)
            self._call(self.client.set_terminated, recorded.info.run_id, "KILLED")
        return how

    def find_run(self, run_id: str | None):
        """The MLflow run ``run_id`` if the store holds it and it is not deleted, else None.

        "Deleted" is MLflow's ``delete_run`` (the UI's delete: lifecycle stage ``deleted``) or a
        run that ``mlflow gc`` removed; a job whose checkpoint names such a run is trained again.
        Raises:
            TrackingError: the store cannot be asked (not "no such run").
        """
        if not run_id:
            return None
        try:
            run = self.client.get_run(run_id)
        except Exception as e:
            if "RESOURCE_DOES_NOT_EXIST" in str(e) or "not found" in str(e).lower() or \
                    getattr(e, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise TrackingError(redact(f"tracking store {self.uri!r}: cannot read run {run_id}: {_short(e)}"
                                       f"{_auth_hint(e)}")) from e
        return None if run.info.lifecycle_stage == "deleted" else run

    def close_run(self, run_id: str, status: str, tags: dict | None = None) -> None:
        """Set ``tags`` on another run of this store and close it with ``status`` (best effort)."""
        for k, v in (tags or {}).items():
            self._call(self.client.set_tag, run_id, k, redact(str(v)))
        self._call(self.client.set_terminated, run_id, status)

    def _recorded_run(self, rec: dict | None):
        """The MLflow run a record names (by id, else by its token tag), or None."""
        if not rec:
            return None
        if rec.get("run_id"):
            try:
                run = self.client.get_run(rec["run_id"])
            except Exception:
                return None
            return None if run.info.lifecycle_stage == "deleted" else run  # a deleted run is never adopted
        if rec.get("token"):
            found = self.client.search_runs([self.experiment_id], f"tags.`harness.run_token` = '{rec['token']}'")
            return found[0] if found else None
        return None

    def heartbeat(self, every_s: float = 60.0) -> None:
        """Set the ``harness.heartbeat`` tag (unix seconds) at most every ``every_s`` seconds, so
        :func:`close_stale_runs` can tell a live run from one whose process died."""
        now = time.time()
        if now - self._beat >= every_s:
            self._beat = now
            self._call(self.client.set_tag, self.run_id, "harness.heartbeat", str(int(now)))

    # ------------------------------------------------------------------ logging
    def log_params(self, params: dict) -> None:
        """Log params (values stringified, cut at MLflow's 6,000-character limit).

        A reopened run (an attempt adopted after a kill) keeps the params it already holds, as
        MLflow cannot change a param: one held with the same value is not sent again; one held
        with another value (the killed attempt ran another commit, say) keeps its first value,
        and this process's value goes to the tag ``harness.param_now.<key>``, with a log line.
        """
        items, differs = [], {}
        for k, v in params.items():
            key, value = redact(k), redact(str(v))[:6000]
            held = self.held_params.get(key)
            if held is None:
                items.append(Param(key, value))
            elif held != value:
                differs[key] = value
        for key, value in differs.items():
            log.info("MLflow run %s keeps param %s=%r, logged before (an earlier attempt's; MLflow cannot change "
                     "a param); this process's %r is in tag harness.param_now.%s", self.run_id, key,
                     self.held_params[key], value, key)
        if differs:
            self.set_tags({f"harness.param_now.{k}": v for k, v in differs.items()})
        for i in range(0, len(items), 100):
            batch = items[i : i + 100]
            try:
                self.client.log_batch(self.run_id, params=batch)
            except Exception as e:
                log.warning("MLflow call log_batch failed: %s", e)
                continue
            self.held_params.update((p.key, p.value) for p in batch)

    def set_tags(self, tags: dict) -> None:
        self._call(self.client.log_batch, self.run_id,
                   tags=[RunTag(redact(k), redact(str(v))) for k, v in tags.items()])

    def queue(self, metrics: dict, step: int) -> None:
        """Queue finite metric values at ``step`` (sent by the next :meth:`flush`); a ``(key, step)``
        the run already holds, or already queued, is dropped (exactly once across kills)."""
        now = int(time.time() * 1000)
        self.extend([Metric(k, float(v), now, step) for k, v in metrics.items()
                     if v is not None and math.isfinite(float(v))])

    def extend(self, metrics: list) -> None:
        """Queue ``mlflow.entities.Metric`` values, dropping ``(key, step)`` pairs already logged or queued."""
        queued = {(m.key, m.step) for m in self.pending}
        for m in metrics:
            if (m.key, m.step) not in self.logged and (m.key, m.step) not in queued:
                self.pending.append(m)
                queued.add((m.key, m.step))

    def log_metrics(self, metrics: dict, step: int) -> None:
        """Queue and flush; on failure the values stay queued for the next flush."""
        self.queue(metrics, step)
        self.flush()

    def flush(self) -> bool:
        """Send queued metrics. Returns False (keeping them queued) if the store is unreachable."""
        while self.pending:
            batch = self.pending[:500]
            try:
                self.client.log_batch(self.run_id, metrics=batch)
            except Exception as e:  # network drop: keep training, retry at the next flush
                log.warning("MLflow unreachable (%s); %d metric values buffered", e, len(self.pending))
                return False
            self.logged.update((m.key, m.step) for m in batch)
            del self.pending[: len(batch)]
        return True

    def log_datasets(self, datasets: list[dict]) -> None:
        """Record the data a run read as MLflow dataset inputs (the run page's Datasets panel).

        Args:
            datasets: ``{"name", "digest", "source_type", "source", "context", "rows"}`` each;
                ``context`` is ``train`` or ``eval`` (MLflow's ``mlflow.data.context`` tag).
        """
        inputs = [DatasetInput(Dataset(name=d["name"], digest=d["digest"][:36], source_type=d["source_type"],
                                       source=json.dumps({"uri": d["source"]}),
                                       profile=json.dumps({"num_rows": d["rows"]})),
                               tags=[InputTag("mlflow.data.context", d["context"])]) for d in datasets]
        for attempt in range(3):  # two jobs registering the same dataset at once: the loser retries
            try:
                self.client.log_inputs(self.run_id, datasets=inputs)
                return
            except Exception as e:
                if attempt == 2:
                    log.warning("MLflow dataset inputs not recorded: %s", str(e).splitlines()[0])
                time.sleep(0.5 + attempt)

    def start_system_metrics(self, interval_s: float) -> None:
        """Sample CPU / memory / GPU use into ``system/*`` metrics every ``interval_s`` seconds
        (MLflow's ``SystemMetricsMonitor``, which needs ``psutil``; ``pynvml`` for GPUs)."""
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # optional: needs psutil

            self._system = SystemMetricsMonitor(self.run_id, sampling_interval=interval_s, resume_logging=True,
                                                tracking_uri=self.uri)
            self._system.start()
        except Exception as e:  # optional: never stop a run for it
            log.warning("system metrics not recorded: %s", e)
            self._system = None

    def log_text(self, text: str, artifact_file: str) -> None:
        self._call(self.client.log_text, self.run_id, redact(text), artifact_file)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        self._call(self.client.log_table, self.run_id, pd.DataFrame(redact_obj(rows)), artifact_file)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, key)]

    def end(self, status: str = "FINISHED") -> None:
        """Flush and close the run with ``status``; buffered metrics are retried for up to
        :data:`END_FLUSH_S` seconds against a server (a restart), 6 s against a local file."""
        if self._system is not None:
            self._call(self._system.finish)
            self._system = None
        # A server may be restarting: keep trying for a while (a local store: briefly) before giving up.
        deadline = time.time() + (END_FLUSH_S if not self.uri.startswith("sqlite") else 6.0)
        while not self.flush() and time.time() < deadline:
            time.sleep(2)
        if self.pending:
            log.error("MLflow store %s unreachable: %d metric values of run %s were not recorded",
                      redact(self.uri), len(self.pending), self.run_id)
        self._call(self.client.set_terminated, self.run_id, status)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            log.warning("MLflow call %s failed: %s", getattr(fn, "__name__", fn), e)


def artifact_path(client, run, rel: str, uri: str) -> Path:
    """A local path of artifact ``rel`` of ``run``: its recorded folder when that exists; for a
    sqlite store moved with its ``mlartifacts/`` folder (e.g. ``results/ablation`` in a fresh
    clone), the same file beside the database; else downloaded from the store.

    Raises:
        mlflow exceptions / OSError when the artifact is nowhere.
    """
    art = urllib.parse.urlparse(run.info.artifact_uri)
    if art.scheme in ("", "file"):
        p = Path(urllib.parse.unquote(art.path)) / rel
        if p.exists():
            return p
    if uri.startswith("sqlite:///"):
        # the experiment's artifact root is mlartifacts/ beside the db (_artifact_location)
        p = Path(uri[len("sqlite:///"):]).resolve().parent / "mlartifacts" / run.info.run_id / "artifacts" / rel
        if p.exists():
            return p
    return Path(client.download_artifacts(run.info.run_id, rel, tempfile.mkdtemp()))


class NullTracker:
    """The tracker of a data-parallel rank other than 0: same interface, records nothing (rank 0
    logs the run; the metrics every rank computes are already reduced over ranks)."""

    uri = ""

    def __init__(self):
        self.run_id: str | None = None
        self.pending: list = []

    def _noop(self, *args, **kwargs):
        return None

    log_params = set_tags = queue = extend = log_metrics = log_text = log_table = heartbeat = end = _noop
    log_datasets = start_system_metrics = _noop

    def flush(self) -> bool:
        return True

    def metric_history(self, key: str) -> list:
        return []


def shared_folder_message(folder, theirs: str, ours: str) -> str:
    """The error for a checkpoint folder that holds another config's job (a multirun whose jobs
    share one ``checkpoint.dir``): adopting its run or resuming its weights would train the wrong
    config under this one's name."""
    return (f"checkpoint.dir={folder} holds the run of another config (config key {theirs}; this job's is "
            f"{ours}): jobs with different configs must not share a checkpoint folder. Leave checkpoint.dir "
            "unset (each config gets checkpoints/<config key>) or give each job its own; to continue from "
            "that checkpoint on purpose, pass resume=<its file>")


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _write_record(path: Path, rec: dict) -> None:
    """Write the run record atomically (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)


def _process_alive(pid: int) -> bool:
    """True if ``pid`` is a live harness process on this host (a reused pid of another program is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"harness" in cmdline or b"pytest" in cmdline


def close_stale_runs(client, runs, stale_after_s: float = 6 * 3600, now: float | None = None) -> list[tuple[str, str]]:
    """Close RUNNING runs whose process is gone: KILLED, with the tag ``harness.closed_reason``.

    A run is stale when its ``harness.host`` is this machine and its ``harness.pid`` is not a
    live harness process, or when its ``harness.heartbeat`` (set every step, at most once a
    minute) is older than ``stale_after_s``. Runs without these tags (older harness versions)
    are judged by their start time against ``stale_after_s``.

    Args:
        client: an ``MlflowClient``; runs: ``mlflow.entities.Run`` objects.
    Returns:
        ``[(run_id, reason)]`` for each run closed.
    """
    now = time.time() if now is None else now
    host = socket.gethostname()
    closed = []
    for run in runs:
        if run.info.status != "RUNNING":
            continue
        tags = run.data.tags
        reason = None
        pid = tags.get("harness.pid")
        if tags.get("harness.host") == host and pid and pid.isdigit() and not _process_alive(int(pid)):
            reason = f"process {pid} on {host} is gone (killed); no rerun adopted the run"
        else:
            beat = float(tags.get("harness.heartbeat") or (run.info.start_time or 0) / 1000)
            if now - beat > stale_after_s:
                reason = f"no heartbeat for {(now - beat) / 3600:.1f} h (stale after {stale_after_s / 3600:.1f} h)"
        if reason:
            client.set_tag(run.info.run_id, "harness.closed_reason", reason)
            client.set_terminated(run.info.run_id, "KILLED")
            closed.append((run.info.run_id, reason))
    return closed
