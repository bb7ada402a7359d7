"""The end-of-run summary says where the run is and how to look at it and compare it."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.launch.summary import next_commands, summarize, venv_command


class _Tracker:
    run_id, uri = "abc123", "sqlite:///runs/mlflow.db"


def test_summary_ends_with_the_mlflow_ui_and_report_commands(capsys):
    history = {0: {"eval/accuracy": 0.25, "eval/format_rate": 0.5}, 1: {"train/reward_mean": 0.1},
               2: {"train/reward_mean": 0.3, "eval/accuracy": 0.5, "eval/format_rate": 1.0}}
    assert summarize(history, _Tracker(), Path("out"), Path("ck")) == 0.5
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "eval accuracy : 0.250 -> 0.500"
    assert "train reward  : first half mean 0.100, second half mean 0.300" in lines
    mlflow, report = venv_command("mlflow"), venv_command("harness-report")  # make install puts both in .venv/bin
    assert lines[-2].startswith(f"look at it    : {mlflow} ui --backend-store-uri sqlite:///runs/mlflow.db")
    assert lines[-1].startswith(f"compare runs  : {report} --tracking-uri sqlite:///runs/mlflow.db")
    assert "reports/" in lines[-1]


def test_the_next_commands_work_in_a_new_shell(monkeypatch, tmp_path):
    """Without an activated environment, the summary names the environment's own mlflow and python
    (relative to the working directory when under it); with it on PATH, the bare names."""
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("python", "mlflow"):
        (bin_dir / name).write_text("")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin")
    assert venv_command("mlflow") == ".venv/bin/mlflow"
    assert venv_command("python") == ".venv/bin/python"
    assert next_commands("sqlite:///m.db")[0].startswith("look at it    : .venv/bin/mlflow ui ")
    # an environment without the report's script (a source tree on PYTHONPATH): the module, from the repository root
    assert next_commands("sqlite:///m.db")[1].startswith("compare runs  : .venv/bin/python -m analysis.report ")
    (bin_dir / "harness-report").write_text("")
    assert next_commands("sqlite:///m.db")[1].startswith("compare runs  : .venv/bin/harness-report --tracking-uri ")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert venv_command("mlflow") == str(bin_dir / "mlflow")
    (bin_dir / "mlflow").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin")
    assert venv_command("mlflow") == "mlflow"
    (bin_dir / "mlflow").unlink()
    assert venv_command("mlflow") == "mlflow"  # an environment without it: the name PATH may find


def test_the_compare_runs_command_writes_its_report_from_a_folder_outside_the_repository(tmp_path, monkeypatch):
    """The summary's "compare runs" command, run as printed (less its optional [...] part) in a new
    shell in a folder outside the repository, on a small store (analysis.synthetic's runs): the
    installed ``analysis`` package writes ``reports/REPORT.md`` there."""
    import os
    import shlex
    import subprocess

    from analysis.synthetic import build_synthetic_store
    from tests.conftest import ROOT

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    build_synthetic_store(uri, str(tmp_path / "store" / "artifacts"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert ROOT not in elsewhere.resolve().parents
    monkeypatch.chdir(elsewhere)
    line = next_commands(uri)[1]
    command = line.split(" : ", 1)[1].split(" [", 1)[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    r = subprocess.run(shlex.split(command), cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    report = elsewhere / "reports" / "REPORT.md"
    assert f"[report] wrote {Path('reports') / 'REPORT.md'}" in r.stdout and report.is_file()
    assert "grpo" in report.read_text() and (elsewhere / "reports" / "runs.csv").is_file()
