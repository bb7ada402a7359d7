"""analysis.ablation: intervals over seeds and problems, paired differences, power, the report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis import ablation


def _rec(est, seed, correct, steps=(0, 4, 8), step_time=10.0, mem=4.0):
    c = np.asarray(correct, dtype=float)
    return ablation.RunRecord(f"{est}-{seed}", est, seed, list(steps), c, {s: 60.0 * s for s in steps}, step_time, mem)


def test_auc_is_the_trapezoid_over_the_step_span():
    # accuracies 0.2, 0.4, 0.8 at steps 0, 4, 8: area = 4*(0.2+0.4)/2 + 4*(0.4+0.8)/2 = 3.6, / 8
    assert float(ablation.auc([0, 4, 8], [0.2, 0.4, 0.8])) == pytest.approx(0.45)
    # uneven spacing: steps 0, 2, 8
    assert float(ablation.auc([0, 2, 8], [0.0, 1.0, 1.0])) == pytest.approx((1.0 + 6.0) / 8)


def test_intervals_cover_the_mean_and_stay_in_unit_range():
    rng = np.random.default_rng(0)
    recs = []
    for est, p in (("grpo", 0.3), ("rloo", 0.6)):
        for s in range(3):
            recs.append(_rec(est, s, (rng.random((3, 200)) < p).astype(float)))
    res = ablation.analyse(recs, "grpo", n_boot=400)
    by = {r["estimator"]: r for r in res["summary"]}
    for r in by.values():
        assert 0.0 <= r["final_lo"] <= r["final"] <= r["final_hi"] <= 1.0
        assert r["final_hi"] - r["final_lo"] < 0.15
    assert by["grpo"]["final"] == pytest.approx(np.mean([x.correct[-1].mean() for x in recs[:3]]))
    diff = [p for p in res["paired"] if p["metric"] == "final"][0]
    assert diff["estimator"] == "rloo" and diff["pairs"] == 3
    hand = np.mean([recs[3 + s].correct[-1].mean() - recs[s].correct[-1].mean() for s in range(3)])
    assert diff["diff"] == pytest.approx(hand)
    assert diff["lo"] > 0.2 and diff["p_boot"] < 0.01  # a 30-point gap is found
    assert "rloo ends above grpo" in " ".join(ablation.conclusion(res))


def test_no_difference_reads_not_distinguishable_and_power_uses_the_seed_spread():
    base = np.zeros((3, 100))
    base[:, :40] = 1.0
    recs = [_rec("grpo", s, base) for s in range(3)]
    other = []
    for s, shift in enumerate((-2, 0, 2)):  # per-seed paired differences -2, 0, +2 problems of 100
        c = base.copy()
        if shift > 0:
            c[:, 40:40 + shift] = 1.0
        elif shift < 0:
            c[:, :(-shift)] = 0.0
        other.append(_rec("mean_only", s, c))
    res = ablation.analyse(recs + other, "grpo", n_boot=400)
    text = " ".join(ablation.conclusion(res))
    assert "Not distinguishable at this budget" in text
    sd = np.std([-0.02, 0.0, 0.02], ddof=1)
    assert res["power"]["sd_pooled"] == pytest.approx(sd)
    from scipy import stats

    def power(k, d=0.05):  # the two-sided 5% paired t-test over k seeds, exact (noncentral t)
        crit, nc = stats.t.ppf(0.975, k - 1), d / (sd / math.sqrt(k))
        return stats.nct.sf(crit, k - 1, nc) + stats.nct.cdf(-crit, k - 1, nc)

    n = res["power"]["seeds_needed"]
    assert n >= 2 and power(n) >= 0.8 and (n == 2 or power(n - 1) < 0.8)
    assert power(3, res["power"]["mde"]) == pytest.approx(0.8, abs=1e-9)
    # the t-quantile approximation the report used before claimed a smaller detectable difference
    assert res["power"]["mde"] > (stats.t.ppf(0.975, 2) + stats.t.ppf(0.8, 2)) * sd / math.sqrt(3)


def test_report_from_real_runs(run_dir, dense_rewards, tmp_path):
    """Six tiny runs (2 estimators x 3 seeds) through MLflow, their per-problem eval artifacts, the report."""
    import os

    from tests.conftest import run_job

    for est in ("grpo", "rloo"):
        for seed in (0, 1, 2):
            run_job(f"advantage={est}", f"seed={seed}", "tracking.sweep=abl-test", "eval.size=6")
    out = tmp_path / "res"
    rc = ablation.main(["--tracking-uri", os.environ["MLFLOW_TRACKING_URI"], "--sweep", "abl-test",
                        "--out", str(out), "--boot", "200"])
    assert rc == 0
    text = (out / "ABLATION.md").read_text()
    assert "| grpo | 3 |" in text and "| rloo | 3 |" in text and "Paired differences vs grpo" in text
    assert (out / "plots" / "ablation_accuracy_vs_step.png").stat().st_size > 1000
    recs = ablation.load_sweep(os.environ["MLFLOW_TRACKING_URI"], "abl-test")
    assert len(recs) == 6 and all(r.correct.shape == (3, 6) for r in recs)  # evals at steps 0, 1, 2
    assert ablation.main(["--tracking-uri", os.environ["MLFLOW_TRACKING_URI"], "--sweep", "nope",
                          "--out", str(out)]) == 2


def test_provenance_lines_show_the_cpu_details_only_where_runs_recorded_them():
    old = [_rec("grpo", s, [[1, 0]]) for s in (0, 1)]
    for r in old:
        r.params = {"provenance.machine.cpu": "AMD EPYC"}
    lines = ablation._provenance_lines(old)
    assert "- `machine.cpu`: `AMD EPYC`" in lines
    assert not any("cpu_family_model" in ln or "cpu_capability" in ln for ln in lines)  # older report unchanged
    old[1].params |= {"provenance.machine.cpu_family_model": "25/17", "provenance.machine.cpu_capability": "AVX512"}
    lines = ablation._provenance_lines(old)
    assert "- `machine.cpu_family_model`: `25/17`, `<not recorded>` **(differs between runs)**" in lines
    assert "- `machine.cpu_capability`: `<not recorded>`, `AVX512` **(differs between runs)**" in lines
