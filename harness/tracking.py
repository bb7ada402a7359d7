"""MLflow tracking: one run per job, metrics buffered so a flaky server never kills training."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import math
import os
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///mlflow.db"


class TrackingError(RuntimeError):
    """The tracking store cannot be reached or used; the message names the URI."""


def resolve_uri(configured: str | None) -> str:
    """``tracking.uri`` if set, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` (cwd)."""
    return configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI


def git_commit() -> str:
    """The current git commit of the harness checkout, or ``unknown``."""
    try:
        return subprocess.check_output(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, stderr=subprocess.DEVNULL, text=True
        ).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


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


class Tracker:
    """Wraps ``MlflowClient`` for one run.

    Args:
        uri: tracking URI (sqlite URL, http(s) server, ...).
        experiment: experiment name (created if missing).
    Raises:
        TrackingError: the store is unreachable or rejects the experiment (before any compute).

    Call :meth:`start` to create (or reopen) the run.
    """

    def __init__(self, uri: str, experiment: str):
        import mlflow
        from mlflow.tracking import MlflowClient

        self.uri = uri
        if uri.startswith("sqlite:///"):
            db = Path(uri[len("sqlite:///"):])
            if not db.parent.is_dir():
                raise TrackingError(f"tracking store {uri!r}: folder {str(db.parent)!r} does not exist; "
                                    "create it or set tracking.uri / MLFLOW_TRACKING_URI to another sqlite path")
        mlflow.set_tracking_uri(uri)
        if uri.startswith("http"):  # fail fast instead of MLflow's long retry loop
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        with _store_lock(uri):  # parallel jobs must not create one new sqlite store's tables twice
            self.client = MlflowClient(uri)
            try:
                exp = self.client.get_experiment_by_name(experiment)
                self.experiment_id = exp.experiment_id if exp else self.client.create_experiment(
                    experiment, artifact_location=_artifact_location(uri))
            except Exception as e:
                raise TrackingError(
                    f"tracking store {uri!r} is not usable ({type(e).__name__}: {e}); set tracking.uri=... "
                    "or MLFLOW_TRACKING_URI to a reachable server or a sqlite URL like sqlite:///mlflow.db"
                ) from e
        self.run_id: str | None = None
        self.pending: list = []

    def start(self, run_name: str | None = None, run_id: str | None = None) -> str:
        """Create a run, or reopen ``run_id`` (resume); returns the run id.

        Raises:
            TrackingError: the run cannot be created or ``run_id`` does not exist.
        """
        try:
            if run_id:
                self.run_id = self.client.get_run(run_id).info.run_id
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.run_id = self.client.create_run(self.experiment_id, run_name=run_name).info.run_id
        except Exception as e:
            raise TrackingError(f"tracking store {self.uri!r}: cannot open run {run_id or 'new'}: {e}") from e
        return self.run_id

    # ------------------------------------------------------------------ logging
    def log_params(self, params: dict) -> None:
        """Log params (values stringified, cut at MLflow's 6,000-character limit)."""
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self._call(self.client.log_batch, self.run_id, params=items[i : i + 100])

    def set_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        self._call(self.client.log_batch, self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def queue(self, metrics: dict, step: int) -> None:
        """Queue finite metric values at ``step`` (sent by the next :meth:`flush`)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        for k, v in metrics.items():
            if v is not None and math.isfinite(float(v)):
                self.pending.append(Metric(k, float(v), now, step))

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
            del self.pending[: len(batch)]
        return True

    def log_text(self, text: str, artifact_file: str) -> None:
        self._call(self.client.log_text, self.run_id, text, artifact_file)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        import pandas as pd

        self._call(self.client.log_table, self.run_id, pd.DataFrame(rows), artifact_file)

    def metric_history(self, key: str) -> list[tuple[int, float]]:
        return [(m.step, m.value) for m in self.client.get_metric_history(self.run_id, key)]

    def end(self, status: str = "FINISHED") -> None:
        """Flush (retrying briefly) and close the run with ``status``."""
        for _ in range(3):
            if self.flush():
                break
            time.sleep(2)
        self._call(self.client.set_terminated, self.run_id, status)

    def _call(self, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            log.warning("MLflow call %s failed: %s", getattr(fn, "__name__", fn), e)
