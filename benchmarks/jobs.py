"""Run one ``harness.run`` job as a subprocess in its own folder and open its MLflow record
(shared by the benchmarks that measure whole runs)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def run_job(overrides: list[str], folder: Path, launcher: list[str] | None = None, env: dict | None = None,
            cwd: Path | None = None):
    """``python -m harness.run <overrides>`` (or ``<launcher> -m harness.run ...``, e.g. torchrun) with
    its checkpoints and its sqlite MLflow store in ``folder``.

    Returns:
        ``(wall seconds, MlflowClient, the experiment's runs)``.
    Raises:
        SystemExit: the job failed (the command and the tail of its stderr).
    """
    from mlflow.tracking import MlflowClient

    folder.mkdir(parents=True, exist_ok=True)
    head = launcher or [sys.executable]
    cmd = [*head, "-m", "harness.run", *overrides, f"checkpoint.dir={folder / 'ck'}",
           f"tracking.uri=sqlite:///{folder / 'mlflow.db'}"]
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "MLFLOW_TRACKING_URI"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd or folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])
    return wall, client, runs
