"""End-to-end tests of analysis.collect/compare/plots/report on a synthetic sqlite MLflow store.

One store is built per test session (analysis.synthetic documents its exact values):
grpo/ppo x G=4/8 x seeds 0/1 FINISHED, one FAILED and one RUNNING run, and one run in a
second experiment.
"""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.synthetic import GIB, final_accuracy

T975_DF1 = 12.706204736174707


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    from analysis.synthetic import build_synthetic_store

    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    ids = build_synthetic_store(uri, str(root / "artifacts"))
    _mark_live(uri, ids["RUNNING"])  # a run in progress: collect must leave it RUNNING
    return {"uri": uri, "ids": ids}


def _mark_live(uri, run_ids):
    """Give runs the identity of a live process (this pytest) and a fresh heartbeat."""
    import os
    import socket
    import time

    from mlflow import MlflowClient

    client = MlflowClient(uri)
    for rid in run_ids:
        for k, v in {"harness.host": socket.gethostname(), "harness.pid": str(os.getpid()),
                     "harness.heartbeat": str(int(time.time()))}.items():
            client.set_tag(rid, k, v)


@pytest.fixture(scope="session")
def coll(store):
    from analysis.collect import collect_runs

    return collect_runs(store["uri"], verbose=False)


def test_collect_runs_frame(coll, store):
    runs = coll.runs
    assert len(runs) == 8 and set(runs["run_id"]) == set(store["ids"]["FINISHED"])
    assert (runs["status"] == "FINISHED").all() and (runs["experiment"] == "grpo-harness").all()
    for col in ["run_id", "status", "experiment", "estimator", "group_size", "seed", "sweep", "task",
                "tags.estimator", "params.advantage.name", "params.policy_loss.epsilon", "params.eval.num_samples",
                "metrics.final/eval_accuracy", "metrics.train/reward_mean"]:
        assert col in runs.columns, col
    assert sorted(runs.groupby(["estimator", "group_size"]).size().tolist()) == [2, 2, 2, 2]
    assert runs["group_size"].tolist() and set(runs["group_size"]) == {4, 8}
    row = runs[(runs["estimator"] == "ppo") & (runs["group_size"] == 8) & (runs["seed"] == 1)].iloc[0]
    assert row["metrics.final/eval_accuracy"] == pytest.approx(0.49)
    assert row["metrics.final/peak_mem_bytes"] == 4.5 * GIB
    assert row["params.kl.form"] == "k3" and row["sweep"] == "s1"
    assert not any(c.startswith("tags.mlflow.") for c in runs.columns)


def test_collect_history_frame(coll):
    hist = coll.history
    assert list(hist.columns) == ["run_id", "key", "step", "value", "timestamp"]
    assert set(hist["run_id"]) == set(coll.runs["run_id"])
    rid = coll.runs.loc[(coll.runs["estimator"] == "grpo") & (coll.runs["group_size"] == 4)
                        & (coll.runs["seed"] == 1), "run_id"].iloc[0]
    rew = hist[(hist["run_id"] == rid) & (hist["key"] == "train/reward_mean")]
    assert rew["step"].tolist() == [1, 2, 3, 4]
    np.testing.assert_allclose(rew["value"], [0.12, 0.22, 0.32, 0.42])
    assert hist[(hist["run_id"] == rid) & (hist["key"] == "eval/accuracy")]["step"].tolist() == [0, 2, 4]
    # 23 train/time/perf keys x 4 steps + 5 eval keys x 3 evals + 4 final keys, per run
    assert len(hist) == 8 * (23 * 4 + 5 * 3 + 4)


def test_collect_skips_and_reports_unfinished(store, capsys):
    from analysis.collect import collect_runs

    coll = collect_runs(store["uri"])  # the RUNNING run is live (fixture): left alone
    out = capsys.readouterr().out
    assert set(coll.skipped["run_id"]) == set(store["ids"]["FAILED"] + store["ids"]["RUNNING"])
    assert set(coll.skipped["status"]) == {"FAILED", "RUNNING"}
    assert "2 unfinished/failed run(s) skipped" in out
    for rid in store["ids"]["FAILED"] + store["ids"]["RUNNING"]:
        assert rid in out and rid not in set(coll.history["run_id"])
    incl = collect_runs(store["uri"], include_unfinished=True, verbose=False)
    assert len(incl.runs) == 10 and set(incl.runs["status"]) == {"FINISHED", "FAILED", "RUNNING"}


def test_collect_closes_stale_running_runs(tmp_path, capsys):
    """A RUNNING run that started long ago with no heartbeat, and one whose process on this host
    is gone, are closed as KILLED with the reason; a live one stays RUNNING."""
    import socket
    import subprocess
    import sys

    from mlflow import MlflowClient

    from analysis.collect import collect_runs
    from analysis.synthetic import build_synthetic_store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    (old,) = build_synthetic_store(uri, str(tmp_path / "artifacts"))["RUNNING"]
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("grpo-harness").experiment_id
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    dead = client.create_run(exp, tags={"harness.host": socket.gethostname(), "harness.pid": dead_pid}).info.run_id
    live = client.create_run(exp).info.run_id
    _mark_live(uri, [live])
    coll = collect_runs(uri)
    out = capsys.readouterr().out
    assert f"closed stale run {old} as KILLED: no heartbeat" in out
    assert f"closed stale run {dead} as KILLED: process {dead_pid}" in out
    for rid, why in ((old, "no heartbeat"), (dead, "is gone")):
        run = client.get_run(rid)
        assert run.info.status == "KILLED" and why in run.data.tags["harness.closed_reason"]
    assert client.get_run(live).info.status == "RUNNING" and live in set(coll.skipped["run_id"])


def test_collect_filters(store, monkeypatch, capsys):
    from analysis.collect import build_filter, collect_runs, parse_tags, resolve_tracking_uri

    assert build_filter({"estimator": "grpo"}, "s1") == "tags.`estimator` = 'grpo' and tags.`sweep` = 's1'"
    assert parse_tags(["task=gsm8k", "seed=0"]) == {"task": "gsm8k", "seed": "0"}
    uri = store["uri"]
    grpo = collect_runs(uri, tags={"estimator": "grpo"}, verbose=False)
    assert len(grpo.runs) == 4 and set(grpo.runs["estimator"]) == {"grpo"} and len(grpo.skipped) == 1
    assert len(collect_runs(uri, tags={"estimator": "grpo", "group_size": "8"}, verbose=False).runs) == 2
    assert len(collect_runs(uri, sweep="s1", verbose=False).runs) == 8
    assert len(collect_runs(uri, sweep="nope", verbose=False).runs) == 0
    other = collect_runs(uri, experiments=["other-exp"], verbose=False)
    assert len(other.runs) == 1 and other.runs["sweep"].iloc[0] == "s0"
    both = collect_runs(uri, experiments=["grpo-harness", "other-exp"], verbose=False)
    assert len(both.runs) == 9 and set(both.runs["experiment"]) == {"grpo-harness", "other-exp"}
    assert len(collect_runs(uri, experiments=["other-exp", "grpo-harness"], sweep="s0", verbose=False).runs) == 1
    missing = collect_runs(uri, experiments=["does-not-exist"])
    assert len(missing.runs) == 0 and "not found" in capsys.readouterr().out
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert resolve_tracking_uri(None) == uri and resolve_tracking_uri("x://y") == "x://y"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert resolve_tracking_uri(None) == "sqlite:///mlflow.db"


def test_collect_cli_roundtrip(store, tmp_path):
    from analysis.collect import load_collection, main

    assert main(["--tracking-uri", store["uri"], "--out", str(tmp_path), "--parquet"]) == 0
    for name in ("runs", "history", "skipped_runs"):
        assert (tmp_path / f"{name}.csv").exists() and (tmp_path / f"{name}.parquet").exists()
    back = load_collection(tmp_path)
    assert len(back.runs) == 8 and len(back.skipped) == 2 and back.runs["run_id"].map(len).eq(32).all()
    assert pd.read_parquet(tmp_path / "history.parquet").shape == back.history.shape


def test_compare_on_collected(coll):
    from analysis.compare import per_run_metrics, summarize

    per_run = per_run_metrics(coll.runs, coll.history)
    summ = summarize(per_run)
    assert len(summ[summ["metric"] == "final_eval_accuracy"]) == 4

    def cell(est, g, metric):
        return summ[(summ["estimator"] == est) & (summ["group_size"] == g) & (summ["metric"] == metric)].iloc[0]

    acc = cell("grpo", 4, "final_eval_accuracy")
    half = T975_DF1 * np.std([0.50, 0.51], ddof=1) / math.sqrt(2)
    assert acc["n"] == 2 and acc["mean"] == pytest.approx(0.505)
    assert (acc["ci_lo"], acc["ci_hi"]) == (pytest.approx(0.505 - half), pytest.approx(0.505 + half))
    # reward 0.05*s + 0.02*seed over steps 1..4 -> average 0.125 + 0.02*seed
    assert cell("ppo", 8, "reward_auc")["mean"] == pytest.approx((0.125 + 0.145) / 2)
    assert cell("ppo", 8, "peak_mem_gib")["mean"] == pytest.approx(4.5)
    assert cell("grpo", 8, "step_time_s")["mean"] == pytest.approx(2.0)
    assert cell("ppo", 4, "wall_time_s")["mean"] == pytest.approx(8.0)


def test_paired_on_collected(coll):
    from analysis.compare import paired_compare, per_run_metrics

    per_run = per_run_metrics(coll.runs, coll.history)
    paired = paired_compare(per_run, {"estimator": "grpo"}, {"estimator": "ppo"}, n_boot=4000).set_index("metric")
    acc = paired.loc["final_eval_accuracy"]
    diffs = [final_accuracy("grpo", g, s) - final_accuracy("ppo", g, s) for g in (4, 8) for s in (0, 1)]
    assert acc["n_pairs"] == 4 and acc["pair_on"] == "group_size,seed"
    assert acc["mean_diff"] == pytest.approx(np.mean(diffs)) == pytest.approx(0.09)
    assert min(diffs) - 1e-12 <= acc["boot_lo"] < 0.09 < acc["boot_hi"] <= max(diffs) + 1e-12
    a = [final_accuracy("grpo", g, s) for g in (4, 8) for s in (0, 1)]
    b = [final_accuracy("ppo", g, s) for g in (4, 8) for s in (0, 1)]
    assert acc["welch_p"] == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue)
    assert paired.loc["peak_mem_gib", "mean_diff"] == pytest.approx(-1.25)


def test_plots_write_every_file(coll, tmp_path):
    from analysis.plots import PLOT_FILES, curve_by_time, make_plots

    written = make_plots(coll.runs, coll.history, out=tmp_path, verbose=False)
    assert set(written) == set(PLOT_FILES)
    for name in PLOT_FILES:
        path = tmp_path / "plots" / name
        assert path.exists() and path.read_bytes()[:4] == b"\x89PNG", name
    curve = curve_by_time(coll.history, coll.runs, "eval/accuracy")
    grpo4 = curve[curve["variant"] == "grpo G=4"]
    assert grpo4["x"].max() == pytest.approx(4.0) and grpo4["mean"].iloc[-1] == pytest.approx(0.505)


def test_report_end_to_end(store, tmp_path, monkeypatch, capsys):
    from analysis.plots import PLOT_FILES
    from analysis.report import main

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store["uri"])
    out = tmp_path / "results"
    assert main(["--sweep", "s1", "--out", str(out), "--a", "estimator=grpo", "--b", "estimator=ppo",
                 "--n-boot", "2000"]) == 0
    for name in ("runs.csv", "history.csv", "skipped_runs.csv", "per_run.csv", "summary.csv", "paired.csv"):
        assert (out / name).exists(), name
    text = (out / "REPORT.md").read_text()
    assert "## Summary over seeds" in text and "## Paired comparison" in text and "### Skipped runs" in text
    assert "| estimator | group_size |" in text and "0.505 [0.441, 0.569]" in text
    assert "| final_eval_accuracy |" in text and "FAILED" in text and "RUNNING" in text
    for name in PLOT_FILES:
        assert f"](plots/{name})" in text and (out / "plots" / name).exists()
    assert "wrote" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["collect", "compare", "plots", "report", "synthetic"])
def test_cli_help(module, capsys):
    import importlib

    mod = importlib.import_module(f"analysis.{module}")
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0 and "usage: python -m analysis." in capsys.readouterr().out


def test_compare_and_plots_cli_from_saved(store, tmp_path):
    from analysis import collect, compare, plots

    collect.main(["--tracking-uri", store["uri"], "--out", str(tmp_path)])
    assert compare.main(["--results", str(tmp_path), "--a", "estimator=grpo,group_size=8",
                         "--b", "estimator=ppo,group_size=8", "--n-boot", "500"]) == 0
    paired = pd.read_csv(tmp_path / "paired.csv").set_index("metric")
    assert paired.loc["final_eval_accuracy", "n_pairs"] == 2 and paired.loc["final_eval_accuracy", "pair_on"] == "seed"
    assert paired.loc["final_eval_accuracy", "mean_diff"] == pytest.approx(0.09)  # (0.11 + 0.07) / 2
    assert plots.main(["--results", str(tmp_path), "--by", "estimator"]) == 0
    assert len(list((tmp_path / "plots").glob("*.png"))) == 9


def test_collect_missing_sqlite_store_is_not_created(tmp_path, capsys):
    from analysis.collect import collect_runs

    db = tmp_path / "absent.db"
    coll = collect_runs(f"sqlite:///{db}")
    assert len(coll.runs) == 0 and len(coll.history) == 0 and not db.exists()
    assert "no MLflow store" in capsys.readouterr().out
