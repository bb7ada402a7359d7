"""Screenshots of the MLflow UI for a run, or of optuna-dashboard for a sweep's study, to check
that the record reads well in a real browser.

    python -m analysis.screenshot --tracking-uri sqlite:///results/ablation/mlflow.db [--run-id ID] \\
        [--out results/mlflow_ui]
    python -m analysis.screenshot --optuna-storage sqlite:///optuna.db --study smoke --out results/optuna_dashboard

Starts ``mlflow server`` (or ``optuna-dashboard``, ``pip install optuna-dashboard``) on 127.0.0.1
(a free port) against the store, renders the pages with headless Chromium (``chromium``, e.g.
Debian's ``apt-get install chromium``), writes the PNGs and stops the server. Not part of the test
suite (it needs a browser); the shots under ``results/`` say when they were taken.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import optuna
from mlflow.tracking import MlflowClient


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shoot(url: str, path: Path, browser: str, width: int = 1600, height: int = 1400) -> Path:
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", "--virtual-time-budget=15000", f"--screenshot={path}", url],
                   check=True, capture_output=True, timeout=120)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.screenshot", description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", default=None, help="an MLflow store: shots of its runs")
    ap.add_argument("--optuna-storage", default=None, help="an Optuna storage: shots of --study in optuna-dashboard")
    ap.add_argument("--study", default=None)
    ap.add_argument("--experiment", default="grpo-harness")
    ap.add_argument("--run-id", default=None, help="default: the latest FINISHED run")
    ap.add_argument("--out", default="results/mlflow_ui")
    a = ap.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("error: no chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    if a.optuna_storage:
        return optuna_shots(a.optuna_storage, a.study, Path(a.out), browser)
    if not a.tracking_uri:
        print("error: give --tracking-uri or --optuna-storage", file=sys.stderr)
        return 2
    client = MlflowClient(a.tracking_uri)
    exp = client.get_experiment_by_name(a.experiment)
    if exp is None:
        print(f"error: no experiment {a.experiment!r} in {a.tracking_uri}", file=sys.stderr)
        return 2
    run_id = a.run_id or client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'",
                                            order_by=["attributes.end_time DESC"], max_results=1)[0].info.run_id
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", a.tracking_uri,
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(base + "/health")
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        # MLflow 3's UI opens in its GenAI workflow unless asked (a per-browser setting)
        q = "?workflowType=machine_learning"
        shots = {
            "experiment_runs.png": f"{base}/#/experiments/{exp.experiment_id}/runs{q}",
            "run_overview.png": f"{base}/#/experiments/{exp.experiment_id}/runs/{run_id}{q}",
            "run_metrics.png": f"{base}/#/experiments/{exp.experiment_id}/runs/{run_id}/model-metrics{q}",
        }
        shoot_all(shots, out, browser)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


def shoot_all(shots: dict, out: Path, browser: str) -> None:
    """``{file name: url}`` -> PNGs in ``out``, each printed with its url."""
    for name, url in shots.items():
        print(f"{shoot(url, out / name, browser)}  <- {url}")


def _wait(url: str, tries: int = 120) -> None:
    for _ in range(tries):
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)


def optuna_shots(storage: str, study: str | None, out: Path, browser: str) -> int:
    """optuna-dashboard's study list and the study's history page (the objective's name, the
    trials' values) as PNGs in ``out``."""
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
    if not Path(exe).exists():
        print("error: optuna-dashboard is not installed (pip install optuna-dashboard)", file=sys.stderr)
        return 2
    summaries = optuna.get_all_study_summaries(storage)
    pick = [s for s in summaries if study in (None, s.study_name)]
    if not pick:
        print(f"error: no study {study!r} in {storage}", file=sys.stderr)
        return 2
    port = _free_port()
    server = subprocess.Popen([exe, storage, "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait(base + "/api/studies")
        out.mkdir(parents=True, exist_ok=True)
        sid = pick[0]._study_id
        shots = {"studies.png": f"{base}/dashboard", "study_history.png": f"{base}/dashboard/studies/{sid}",
                 "study_trials.png": f"{base}/dashboard/studies/{sid}/trial-table"}
        shoot_all(shots, out, browser)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
