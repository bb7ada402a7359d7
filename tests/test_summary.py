"""The end-of-run summary says where the run is and how to look at it and compare it."""

from __future__ import annotations

from pathlib import Path

from harness.run import summarize


class _Tracker:
    run_id, uri = "abc123", "sqlite:///runs/mlflow.db"


def test_summary_ends_with_the_mlflow_ui_and_report_commands(capsys):
    history = {0: {"eval/accuracy": 0.25, "eval/format_rate": 0.5}, 1: {"train/reward_mean": 0.1},
               2: {"train/reward_mean": 0.3, "eval/accuracy": 0.5, "eval/format_rate": 1.0}}
    assert summarize(history, _Tracker(), Path("out"), Path("ck")) == 0.5
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "eval accuracy : 0.250 -> 0.500"
    assert "train reward  : first half mean 0.100, second half mean 0.300" in lines
    assert lines[-2].startswith("look at it    : mlflow ui --backend-store-uri sqlite:///runs/mlflow.db")
    assert lines[-1].startswith("compare runs  : python -m analysis.report --tracking-uri sqlite:///runs/mlflow.db")
    assert "reports/" in lines[-1]
