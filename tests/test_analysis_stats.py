"""Unit tests of the analysis statistics and table helpers (no MLflow store needed)."""

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.compare import paired_compare, parse_variant, per_run_metrics, reward_auc, summarize
from analysis.mdtable import markdown_table
from analysis.stats import paired_bootstrap_ci, t_ci, welch_p

T975_DF1 = 12.706204736174707  # t quantile 0.975, 1 degree of freedom
T975_DF3 = 3.182446305284263


def test_t_ci_hand_values():
    mean, lo, hi, n = t_ci([0.5, 0.51])
    half = T975_DF1 * np.std([0.5, 0.51], ddof=1) / math.sqrt(2)
    assert (mean, n) == (pytest.approx(0.505), 2)
    assert lo == pytest.approx(0.505 - half) and hi == pytest.approx(0.505 + half)
    assert half == pytest.approx(0.0635310, abs=1e-6)
    x = [1.0, 2.0, 3.0, 6.0]
    mean, lo, hi, n = t_ci(x)
    assert hi - mean == pytest.approx(T975_DF3 * np.std(x, ddof=1) / 2)


def test_t_ci_single_and_empty_give_nan_ci():
    mean, lo, hi, n = t_ci([0.7, float("nan")])
    assert mean == 0.7 and n == 1 and math.isnan(lo) and math.isnan(hi)
    assert math.isnan(t_ci([])[0])


def test_reward_auc_by_hand():
    # trapezoids: [1,2]: (0+1)/2 = .5 ; [2,4]: 2*(1+1)/2 = 2 ; span 3
    assert reward_auc([1, 2, 4], [0, 1, 1]) == pytest.approx(2.5 / 3)
    assert reward_auc([4, 1, 2], [1, 0, 1]) == pytest.approx(2.5 / 3)  # unsorted input
    assert reward_auc([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.25)
    assert reward_auc([3], [0.4]) == 0.4
    assert math.isnan(reward_auc([], []))


def test_bootstrap_ci_brackets_and_is_deterministic():
    diffs = [0.1, 0.08, 0.11, 0.07]
    lo, hi = paired_bootstrap_ci(diffs, n_boot=5000, seed=0)
    assert 0.07 - 1e-12 <= lo < np.mean(diffs) < hi <= 0.11 + 1e-12
    assert (lo, hi) == paired_bootstrap_ci(diffs, n_boot=5000, seed=0)
    assert all(math.isnan(v) for v in paired_bootstrap_ci([0.1]))


def test_welch_matches_scipy():
    a, b = [0.50, 0.51, 0.55, 0.56], [0.40, 0.43, 0.44, 0.49]
    ref = stats.ttest_ind(a, b, equal_var=False)
    t, p = welch_p(a, b)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    assert math.isnan(welch_p([1.0], [1.0, 2.0])[1])


def _hand_per_run():
    rows = []
    acc = {("grpo", 0): 0.50, ("grpo", 1): 0.60, ("ppo", 0): 0.45, ("ppo", 1): 0.50}
    for (est, seed), value in acc.items():
        rows.append({"run_id": f"{est}{seed}", "estimator": est, "group_size": 4, "seed": seed,
                     "final_eval_accuracy": value})
    rows.append({"run_id": "solo", "estimator": "rloo", "group_size": 4, "seed": 0, "final_eval_accuracy": 0.3})
    return pd.DataFrame(rows)


def test_summarize_and_paired_on_hand_frame():
    per_run = _hand_per_run()
    summ = summarize(per_run, ["estimator", "group_size"], ["final_eval_accuracy"])
    grpo = summ[summ["estimator"] == "grpo"].iloc[0]
    assert grpo["n"] == 2 and grpo["mean"] == pytest.approx(0.55)
    assert grpo["ci_hi"] - grpo["mean"] == pytest.approx(T975_DF1 * np.std([0.5, 0.6], ddof=1) / math.sqrt(2))
    solo = summ[summ["estimator"] == "rloo"].iloc[0]
    assert solo["n"] == 1 and math.isnan(solo["ci_lo"]) and math.isnan(solo["ci_hi"])

    paired = paired_compare(per_run, parse_variant("estimator=grpo"), {"estimator": "ppo"},
                            ["estimator", "group_size"], ["final_eval_accuracy"], n_boot=2000)
    row = paired.iloc[0]
    assert row["pair_on"] == "group_size,seed" and row["n_pairs"] == 2
    assert row["mean_diff"] == pytest.approx(0.075)  # (0.05 + 0.10) / 2
    assert 0.05 - 1e-12 <= row["boot_lo"] <= 0.075 <= row["boot_hi"] <= 0.10 + 1e-12
    assert row["welch_p"] == pytest.approx(stats.ttest_ind([0.5, 0.6], [0.45, 0.5], equal_var=False).pvalue)


def test_parse_variant_and_numeric_matching():
    assert parse_variant("estimator=grpo, group_size=8") == {"estimator": "grpo", "group_size": "8"}
    with pytest.raises(ValueError):
        parse_variant("grpo")
    per_run = _hand_per_run()
    paired = paired_compare(per_run, {"estimator": "grpo", "group_size": "4.0"}, {"estimator": "ppo"},
                            metrics=["final_eval_accuracy"], n_boot=100)
    assert paired.iloc[0]["n_pairs"] == 2 and paired.iloc[0]["pair_on"] == "seed"


def test_per_run_metrics_falls_back_to_history():
    runs = pd.DataFrame({"run_id": ["r1"], "estimator": ["grpo"], "group_size": [4], "seed": [0]})
    hist = pd.DataFrame([
        ("r1", "eval/accuracy", 0, 0.2, 1), ("r1", "eval/accuracy", 4, 0.6, 9),
        ("r1", "train/reward_mean", 1, 0.0, 2), ("r1", "train/reward_mean", 2, 1.0, 3),
        ("r1", "train/reward_mean", 4, 1.0, 5), ("r1", "time/step_s", 1, 1.0, 2),
        ("r1", "time/step_s", 2, 3.0, 3), ("r1", "perf/peak_mem_bytes", 1, 2 ** 30, 2),
        ("r1", "perf/peak_mem_bytes", 2, 2 ** 31, 3), ("r1", "time/elapsed_s", 2, 4.0, 3),
    ], columns=["run_id", "key", "step", "value", "timestamp"])
    row = per_run_metrics(runs, hist).iloc[0]
    assert row["final_eval_accuracy"] == 0.6
    assert row["reward_auc"] == pytest.approx(2.5 / 3)
    assert row["step_time_s"] == 2.0 and row["peak_mem_gib"] == 2.0 and row["wall_time_s"] == 4.0
    assert math.isnan(row["final_pass_at_k"])


def test_markdown_table_format():
    df = pd.DataFrame({"name": ["a|b", "c"], "x": [1.0, 0.123456], "n": [1, None]})
    text = markdown_table(df)
    lines = text.strip().splitlines()
    assert lines[0].startswith("| name") and len(lines) == 4
    assert set(lines[1]) <= set("|-:") and lines[1].endswith(":|")
    assert "a\\|b" in text and "0.1235" in text


def test_plots_skip_missing_data(tmp_path, capsys):
    from analysis.plots import make_plots

    runs = pd.DataFrame({"run_id": ["r1"], "estimator": ["grpo"], "group_size": [4], "seed": [0]})
    hist = pd.DataFrame([("r1", "train/reward_mean", 1, 0.1, 1), ("r1", "train/reward_mean", 2, 0.2, 2)],
                        columns=["run_id", "key", "step", "value", "timestamp"])
    written = make_plots(runs, hist, out=tmp_path)
    assert set(written) == {"train_reward_vs_step.png"}
    assert (tmp_path / "plots" / "train_reward_vs_step.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "skipped eval_accuracy_vs_step.png" in out and "skipped kl_vs_reward.png" in out
    empty = make_plots(runs.iloc[0:0], hist.iloc[0:0], out=tmp_path / "empty")
    assert empty == {}


def test_every_step_axis_has_integer_ticks_on_a_2_step_run(tmp_path, monkeypatch):
    """A 2-step run: matplotlib's default locator labels the x axis 1.0, 1.2, ... 2.0. Every figure
    with steps on its x axis (analysis.plots, analysis.ablation, analysis.study's primary, secondary
    and family figures) labels integers only."""
    import re
    from types import SimpleNamespace

    from matplotlib.figure import Figure

    from analysis import ablation, study
    from analysis.plots import make_plots

    labels, savefig = [], Figure.savefig

    def record(fig, *args, **kwargs):  # the tick labels of every step axis, as drawn
        savefig(fig, *args, **kwargs)
        labels.extend([t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes if "step" in ax.get_xlabel())

    monkeypatch.setattr(Figure, "savefig", record)
    runs = pd.DataFrame({"run_id": ["r1"], "estimator": ["grpo"], "group_size": [4], "seed": [0]})
    hist = pd.DataFrame([("r1", key, s, 0.1 * s, s) for key in ("train/reward_mean", "eval/accuracy",
                                                               "train/completion_len_mean") for s in (1, 2)],
                        columns=["run_id", "key", "step", "value", "timestamp"])
    make_plots(runs, hist, out=tmp_path, verbose=False)
    recs = {arm: {0: ablation.RunRecord(f"{arm}0", "grpo", 0, [1, 2], np.array([[0, 1], [1, 1]]), {1: 1.0, 2: 2.0},
                                        1.0, 1.0)} for arm in ("A", "B")}
    ablation.plot([recs["A"][0]], tmp_path, n_boot=8)
    client = SimpleNamespace(get_metric_history=lambda run_id, key: [SimpleNamespace(step=s, value=0.1 * s)
                                                                      for s in (1, 2)])
    spec = {"name": "s", "arms": {"A": [], "B": []}, "control": "A", "treatment": "B", "comparisons": ["B"],
            "steps": 2, "metric": {"name": "eval/accuracy", "summary": "final", "scale": 100},
            "test": {"kind": "difference"}, "secondary": ["train/entropy"]}
    study.plot(spec, recs, {"verdict": "inconclusive"}, tmp_path / "s.png", client)
    study.plot_secondary(spec, recs, tmp_path / "s2.png", client)
    study.plot_family(spec, recs, {}, tmp_path / "s3.png", client)
    # 3 from make_plots (reward, eval accuracy, completion length), ablation 1, study 1 + 1 + 2 panels
    assert len(labels) == 8 and all(labels)
    assert all(re.fullmatch(r"[-\u2212]?\d+", t) for axis in labels for t in axis), labels


def test_welch_constant_samples_is_nan():
    assert all(math.isnan(v) for v in welch_p([2.0, 2.0], [3.0, 3.0]))


def test_mixed_params_flags_configurations_pooled_as_seeds():
    from analysis.report import mixed_params

    runs = pd.DataFrame({"estimator": ["grpo"] * 3, "group_size": [4, 4, 8],
                         "params.seed": ["0", "1", "0"], "params.train.lr": ["1e-5", "1e-5", "1e-5"],
                         "params.beta": ["0.0", "0.0", "0.1"]})
    assert mixed_params(runs, ["estimator", "group_size"]) == []  # seed varies, beta only across groups
    assert mixed_params(runs, ["estimator"]) == ["beta"]


def test_accuracy_band_stays_in_range_and_needs_three_runs():
    """The issue's case: a Student-t band over 2 seeds of an accuracy ran from -0.7 to 1.4. The
    bootstrap band is NaN below 3 runs (the runs are drawn instead) and never leaves the data's range."""
    from analysis.plots import bootstrap_band

    assert all(math.isnan(x) for x in bootstrap_band([0.0, 1.0]))
    lo, hi = bootstrap_band([0.0, 0.02, 1.0])
    assert 0.0 <= lo < hi <= 1.0
    lo, hi = bootstrap_band([0.40, 0.42, 0.44, 0.46])
    assert 0.40 <= lo < 0.43 < hi <= 0.46


def test_budget_warnings_name_small_arms_and_identical_reward_histories():
    from analysis.report import budget_warnings

    per_run = pd.DataFrame({"run_id": ["r1aaaaaaaa", "r2bbbbbbbb", "r3cccccccc", "r4dddddddd", "r5eeeeeeee"],
                            "estimator": ["grpo", "grpo", "ppo", "ppo", "ppo"], "group_size": [4] * 5})
    rows = []
    for rid, vals in {"r1aaaaaaaa": [0.25, 0.25, 0.5], "r2bbbbbbbb": [0.0, 0.5, 0.75],
                      "r3cccccccc": [0.25, 0.25, 0.5], "r4dddddddd": [0.1, 0.2, 0.3], "r5eeeeeeee": [0.3, 0.2, 0.1]}.items():
        rows += [{"run_id": rid, "key": "train/reward_mean", "step": s + 1, "value": v, "timestamp": s}
                 for s, v in enumerate(vals)]
    w = budget_warnings(per_run, pd.DataFrame(rows), ["estimator", "group_size"])
    assert len(w) == 2, w
    assert w[0].startswith("arm `grpo 4` has 2 runs: no interval possible")  # ppo has 3: no warning
    assert "r1aaaaaa (`grpo 4`) and r3cccccc (`ppo 4`) drew identical rewards" in w[1]
    # the same arm repeating itself is not a warning; nor is a lone arm of 3 runs
    assert budget_warnings(per_run[per_run.estimator == "ppo"], pd.DataFrame(rows), ["estimator"]) == []
