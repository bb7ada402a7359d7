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
    mlflow, python = venv_command("mlflow"), venv_command("python")
    assert lines[-2].startswith(f"look at it    : {mlflow} ui --backend-store-uri sqlite:///runs/mlflow.db")
    assert lines[-1].startswith(f"compare runs  : {python} -m analysis.report --tracking-uri sqlite:///runs/mlflow.db")
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
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert venv_command("mlflow") == str(bin_dir / "mlflow")
    (bin_dir / "mlflow").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin")
    assert venv_command("mlflow") == "mlflow"
    (bin_dir / "mlflow").unlink()
    assert venv_command("mlflow") == "mlflow"  # an environment without it: the name PATH may find
