"""analysis.study: the verdict rules (one synthetic MLflow store per verdict), resume (only the
missing (arm, seed) jobs are launched), the refusal to change a finished study, power."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from analysis import stats, study
from analysis.study import launch

EVAL_STEPS = (0, 4)


def _spec(tmp_path: Path, name="s", metric=None, test=None, seeds=(0, 1, 2), steps=4, **extra) -> Path:
    spec = {"name": name, "claim": "B beats A.", "source": "a paper, Fig. 1", "setup": "tiny",
            "design": "pilot: none", "base": ["model=tiny"], "arms": {"A": ["train.lr=1e-7"], "B": ["train.lr=1e-5"]},
            "control": "A", "treatment": "B", "seeds": list(seeds), "steps": steps, "eval_size": 100,
            "metric": metric or {"name": "eval/accuracy", "summary": "final", "scale": 100},
            "test": test or {"kind": "difference", "sign": 1, "alpha": 0.05, "delta": 0.1},
            "launcher": "joblib", "jobs": 2, **extra}
    d = tmp_path / "studies"
    d.mkdir(exist_ok=True)
    path = d / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _correct(n_right: int, n=100) -> list[int]:
    return [1] * n_right + [0] * (n - n_right)


def _log_run(client, exp, name, arm, seed, final_right=None, train=None, status="FINISHED"):
    """One run as the trainer logs it: tags, eval/accuracy + per-problem verdicts at steps 0 and 4
    (30 of 100 right at step 0, ``final_right`` at the end), a train metric history ``train``."""
    from mlflow.entities import Metric, RunTag

    run = client.create_run(exp, run_name=f"{arm}-s{seed}")
    rid = run.info.run_id
    metrics = [Metric("time/step_s", 1.0, 0, s) for s in (1, 2, 3, 4)]
    metrics += [Metric("time/elapsed_s", float(s), 0, s) for s in (0, 4)]
    metrics += [Metric("perf/peak_mem_gib", 1.0, 0, 1)]
    for step, right in zip(EVAL_STEPS, (30, 30 if final_right is None else final_right)):
        metrics.append(Metric("eval/accuracy", right / 100, 0, step))
        client.log_text(rid, json.dumps({"step": step, "problem_ids": list(range(100)), "correct": _correct(right)}),
                        f"eval/correct_step_{step:06d}.json")
    for step, v in (train or {}).items():
        metrics.append(Metric("train/entropy", float(v), 0, step))
    client.log_batch(rid, metrics=metrics, tags=[RunTag("sweep", f"{name}.{arm}"), RunTag("seed", str(seed)),
                                                 RunTag("estimator", "grpo"), RunTag("git_commit", "abc"),
                                                 RunTag("git_dirty", "false")])
    if status != "RUNNING":
        client.set_terminated(rid, status=status)
    return rid


def _store(tmp_path, name, runs):
    """``runs``: ``[(arm, seed, final_right, train, status)]`` into results/studies/<name>/mlflow.db."""
    from mlflow import MlflowClient

    d = tmp_path / "results" / "studies" / name
    d.mkdir(parents=True, exist_ok=True)
    client = MlflowClient(f"sqlite:///{d / 'mlflow.db'}")
    exp = client.create_experiment("grpo-harness", artifact_location=(d / "mlartifacts").as_uri())
    for arm, seed, right, train, status in runs:
        _log_run(client, exp, name, arm, seed, right, train, status)
    return tmp_path / "results"


def _report(tmp_path, path):
    spec = study.load_study(path)
    return spec, study.report(spec, path, tmp_path / "results", machine="test box")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------------------ verdict rules
def test_verdict_rules_on_hand_intervals():
    diff = {"kind": "difference", "sign": 1}
    assert study.verdict(diff, 0.01, 0.2, 3) == "reproduced"
    assert study.verdict(diff, -0.2, -0.01, 3) == "contradicted"
    assert study.verdict(diff, -0.01, 0.2, 3) == "inconclusive"
    assert study.verdict(diff, 0.01, 0.2, 1) == "inconclusive"  # one seed: no spread, no verdict
    assert study.verdict({"kind": "difference", "sign": -1}, -0.2, -0.01, 3) == "reproduced"
    eq = {"kind": "equivalence", "margin": 0.1}
    assert study.verdict(eq, -0.05, 0.09, 3) == "reproduced"
    assert study.verdict(eq, 0.1, 0.3, 3) == "contradicted"
    assert study.verdict(eq, -0.3, -0.12, 3) == "contradicted"
    assert study.verdict(eq, -0.05, 0.11, 3) == "inconclusive"


def test_reproduced_store(in_tmp):
    """B: 70 / 72 / 68 of 100 right vs A at the initial 30: effect +40 points, interval above 0."""
    root = _store(in_tmp, "s", [("A", s, 30, None, "FINISHED") for s in range(3)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))])
    spec, res = _report(in_tmp, _spec(in_tmp))
    assert res["verdict"] == "reproduced"
    assert res["effect"] == pytest.approx(0.40)
    assert res["per_seed"] == pytest.approx([0.40, 0.42, 0.38])
    # paired t over the 3 per-seed effects: 0.40 +- t_0.975,2 (4.302652729911275) * 0.02 / sqrt(3)
    half = 4.302652729911275 * 0.02 / math.sqrt(3)
    assert (res["lo"], res["hi"]) == (pytest.approx(0.40 - half, abs=1e-10), pytest.approx(0.40 + half, abs=1e-10))
    assert res["bootstrap"]["verdict"] == "reproduced"  # the secondary interval, beside it
    p = res["power"]  # sd of (0.40, 0.42, 0.38) = 0.02
    assert p["sd"] == pytest.approx(0.02) and p["seeds"] == 3
    assert stats.t_power(0.02, p["mde"], 3) == pytest.approx(0.8, abs=1e-9)  # exact, not t quantiles
    # the t-quantile approximation (t_0.975,2 + t_0.8,2) sd / sqrt(n) claims too small an effect
    assert p["mde"] > (4.302652729911275 + 1.0606601717798214) * 0.02 / math.sqrt(3)
    assert p["seeds_needed"] == 3  # 2 seeds (1 df): power 0.42 at 0.1; 3 seeds: 0.975
    assert stats.t_power(0.02, 0.1, 2) == pytest.approx(0.42096, abs=1e-5)
    # paired t with 2 df at a true difference of 0.1 = 8.66 standard errors: P(T_nc > t_0.975,2 = 4.30)
    assert p["power"] == pytest.approx(0.9755, abs=1e-3)
    text = (root / "studies" / "s.md").read_text()
    assert "**Verdict: reproduced.**" in text and "+40 [" in text and "python -m analysis.study" in text
    assert (root / "studies" / "plots" / "s.png").exists()
    assert json.loads((root / "studies" / "s" / "result.json").read_text())["verdict"] == "reproduced"


def test_report_names_the_machine_the_runs_recorded(in_tmp):
    """A report regenerated on another machine names where the runs ran (their
    ``provenance.machine.*`` params), not the machine that wrote the report."""
    from mlflow import MlflowClient

    root = _store(in_tmp, "s", [(a, s, r, None, "FINISHED") for a, r in (("A", 30), ("B", 70)) for s in range(3)])
    client = MlflowClient(f"sqlite:///{root / 'studies' / 's' / 'mlflow.db'}")
    for run in client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id]):
        client.log_param(run.info.run_id, "provenance.machine.cpu", "Recorded CPU")
        client.log_param(run.info.run_id, "provenance.machine.cores", "4")
    path = _spec(in_tmp)
    res = study.report(study.load_study(path), path, root)  # no machine given: the runs' own
    assert res["measured"].startswith("Recorded CPU (4 cores), ")
    assert "- machine: Recorded CPU (4 cores);" in (root / "studies" / "s.md").read_text()
    assert study.report(study.load_study(path), path, root, machine="test box")["measured"].startswith("test box, ")


def test_contradicted_store(in_tmp):
    _store(in_tmp, "s", [("A", s, 70, None, "FINISHED") for s in range(3)]
           + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (30, 31, 29))])
    _, res = _report(in_tmp, _spec(in_tmp))
    assert res["verdict"] == "contradicted" and res["effect"] == pytest.approx(-0.40)


def test_inconclusive_store_names_the_seeds_needed(in_tmp):
    """Per-seed effects -2, 0, +2 problems of 100: the interval straddles 0."""
    root = _store(in_tmp, "s", [("A", s, 40, None, "FINISHED") for s in range(3)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (38, 40, 42))])
    _, res = _report(in_tmp, _spec(in_tmp))
    assert res["verdict"] == "inconclusive" and res["effect"] == pytest.approx(0.0, abs=1e-12)
    assert res["lo"] < 0 < res["hi"]
    assert res["power"]["seeds_needed"] == 3  # the 3 seeds run suffice for 10 (exact noncentral t)
    assert stats.t_power(0.02, 0.1, 2) < 0.8 <= stats.t_power(0.02, 0.1, 3)
    assert "the effect is smaller than that" in res["verdict_text"]
    assert "inconclusive: the seeds run had" in (root / "studies" / "s.md").read_text()
    # a spread too wide for the seeds run: the report names the seeds a conclusive answer needs
    text = study.verdict_text(study.load_study(_spec(in_tmp)), {**res, "power": {**res["power"], "seeds_needed": 7}})
    assert text == "inconclusive at this budget; a conclusive answer needs about 7 seeds per arm at the measured spread"


def test_equivalence_store_reproduced_and_contradicted(in_tmp):
    eq = {"kind": "equivalence", "margin": 0.1, "alpha": 0.05}
    _store(in_tmp, "e", [("A", s, 50, None, "FINISHED") for s in range(3)]
           + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (51, 50, 49))])
    _, res = _report(in_tmp, _spec(in_tmp, name="e", test=eq))
    assert res["verdict"] == "reproduced" and res["level"] == pytest.approx(0.90)
    assert -0.1 < res["lo"] <= res["hi"] < 0.1
    _store(in_tmp, "f", [("A", s, 50, None, "FINISHED") for s in range(3)]
           + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (80, 82, 78))])
    _, res = _report(in_tmp, _spec(in_tmp, name="f", test=eq))
    assert res["verdict"] == "contradicted" and res["lo"] > 0.1


def test_train_metric_last_third_is_the_window_mean(in_tmp):
    """6 steps: the window is steps 5-6. Entropy of B minus A there: seed 0 (0.30+0.20)/2 -
    (0.10+0.10)/2 = 0.15; seed 1: 0.12; steps 1-4 do not count."""
    a = {0: {1: 0.9, 2: 0.8, 3: 0.5, 4: 0.4, 5: 0.1, 6: 0.1}, 1: {1: 0.9, 2: 0.7, 3: 0.5, 4: 0.3, 5: 0.12, 6: 0.08}}
    b = {0: {1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1, 5: 0.3, 6: 0.2}, 1: {1: 0.0, 2: 0.1, 3: 0.1, 4: 0.1, 5: 0.22, 6: 0.22}}
    _store(in_tmp, "t", [("A", s, None, a[s], "FINISHED") for s in (0, 1)]
           + [("B", s, None, b[s], "FINISHED") for s in (0, 1)])
    metric = {"name": "train/entropy", "summary": "last_third", "scale": 1}
    _, res = _report(in_tmp, _spec(in_tmp, name="t", metric=metric, seeds=(0, 1), steps=6,
                                   test={"kind": "difference", "sign": 1, "alpha": 0.05, "delta": 0.01},
                                   secondary=["train/entropy"]))
    assert res["per_seed"] == pytest.approx([0.15, 0.12])
    assert res["effect"] == pytest.approx(0.135) and res["units"] == 2
    # the seed is the unit: 2 seeds, 1 df: 0.135 +- t_0.975,1 (12.706204736174707) * sd(0.15, 0.12) / sqrt 2
    half = 12.706204736174707 * 0.03 / math.sqrt(2) / math.sqrt(2)
    assert (res["lo"], res["hi"]) == (pytest.approx(0.135 - half, abs=1e-10), pytest.approx(0.135 + half, abs=1e-10))
    assert res["verdict"] == "inconclusive"
    # the old rule resampled the 4 step differences as units: every resample > 0, "reproduced"
    assert res["bootstrap"]["verdict"] == "reproduced" and res["bootstrap"]["lo"] > 0
    assert res["per_arm"]["A"] == pytest.approx({0: 0.10, 1: 0.10})
    # secondary: A's mean over all 6 steps, seed 0 2.8/6, seed 1 2.6/6, mean 0.45
    text = (in_tmp / "results" / "studies" / "t.md").read_text()
    assert "| `train/entropy` | 0.45 [0.4667, 0.4333] |" in text
    # the per-step curve, mean over seeds: A step 1 (0.9+0.9)/2, step 2 (0.8+0.7)/2, ..., step 6 (0.1+0.08)/2
    assert "| `train/entropy` | A | 0.9 | 0.75 | 0.5 | 0.35 | 0.11 | 0.09 |" in text
    assert "| `train/entropy` | B | 0.05 | 0.1 | 0.1 | 0.1 | 0.26 | 0.21 |" in text
    assert (in_tmp / "results" / "studies" / "plots" / "t_secondary.png").stat().st_size > 0


def test_per_step_metrics_are_shown_per_step_under_the_verdict(in_tmp):
    """``per_step: [train/entropy]``: its per-step means over each arm's seeds, in a table between the
    verdict and the rest of the report; a bad ``per_step`` is refused."""
    a = {0: {1: 0.9, 2: 0.8}, 1: {1: 0.7, 2: 0.6}, 2: {1: 0.5, 2: 0.4}}
    b = {0: {1: 0.1, 2: 0.0}, 1: {1: 0.3, 2: 0.2}, 2: {1: 0.2, 2: 0.1}}
    _store(in_tmp, "u", [("A", s, 30, a[s], "FINISHED") for s in a] + [("B", s, 40, b[s], "FINISHED") for s in b])
    _report(in_tmp, _spec(in_tmp, name="u", per_step=["train/entropy"]))
    text = (in_tmp / "results" / "studies" / "u.md").read_text()
    table = ["| metric | arm | step 1 | step 2 |", "|---|---|---|---|",
             "| `train/entropy` | A | 0.7 | 0.6 |", "| `train/entropy` | B | 0.2 | 0.1 |"]
    assert "Shown beside the verdict (`per_step`, not tested): per step, mean over each arm's seeds.\n\n" \
           + "\n".join(table) in text
    assert text.index("**Verdict:") < text.index("Shown beside the verdict") < text.index("Regenerate this report")
    with pytest.raises(study.StudyError, match="per_step must be a list of metric names"):
        study.load_study(_spec(in_tmp, name="v", per_step="train/entropy"))


# ------------------------------------------------------------------------------ resume
@pytest.fixture
def launched(monkeypatch):
    """The commands run_missing launches (nothing runs: each process has exited 0)."""
    cmds = []

    class FakePopen:
        def __init__(self, cmd):
            cmds.append(cmd)

        def poll(self):
            return 0

    monkeypatch.setattr(launch, "_launch", FakePopen)
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    return cmds


def test_resume_launches_only_the_missing_jobs(in_tmp, launched):
    """A: seeds 0-2 FINISHED; B: seed 0 FINISHED, seed 1 FAILED (killed), seed 2 never started ->
    one multirun, arm B, seeds 1 and 2, into the study's store with the arm's sweep tag."""
    root = _store(in_tmp, "s", [("A", s, 30, None, "FINISHED") for s in range(3)]
                  + [("B", 0, 70, None, "FINISHED"), ("B", 1, 50, None, "FAILED")])
    path = _spec(in_tmp)
    spec = study.load_study(path)
    todo = study.run_missing(spec, root, log=lambda m: None)
    assert todo == {"B": [1, 2]}
    assert len(launched) == 1
    cmd = launched[0]
    assert cmd[1:5] == ["-m", "harness.run", "-m", "model=tiny"] and "train.lr=1e-5" in cmd
    assert "seed=1,2" in cmd and "tracking.sweep=s.B" in cmd and "train.steps=4" in cmd
    assert f"tracking.uri=sqlite:///{root / 'studies' / 's' / 'mlflow.db'}" in cmd
    assert "hydra/launcher=joblib" in cmd and "hydra.launcher.n_jobs=2" in cmd
    # every job FINISHED -> nothing is launched
    from mlflow import MlflowClient

    client = MlflowClient(study.store_uri(spec, root))
    exp = client.get_experiment_by_name("grpo-harness").experiment_id
    for seed in (1, 2):
        _log_run(client, exp, "s", "B", seed, 70)
    launched.clear()
    assert study.run_missing(spec, root, log=lambda m: None) == {} and launched == []


def test_two_arms_missing_run_at_once_with_one_job_each(in_tmp, launched):
    root = in_tmp / "results"
    spec = study.load_study(_spec(in_tmp))
    assert study.run_missing(spec, root, log=lambda m: None) == {"A": [0, 1, 2], "B": [0, 1, 2]}
    assert [c[c.index("hydra.launcher.n_jobs=1")] for c in launched] == ["hydra.launcher.n_jobs=1"] * 2
    assert (root / "studies" / "s" / "registration.json").exists()  # registered at the first launch


# ------------------------------------------------------------------------------ refusal
def test_a_finished_study_refuses_a_changed_test_or_metric(in_tmp, capsys):
    _store(in_tmp, "s", [("A", s, 30, None, "FINISHED") for s in range(3)]
           + [("B", s, 70, None, "FINISHED") for s in range(3)])
    path = _spec(in_tmp)
    assert study.main(["--no-run", "--results", str(in_tmp / "results"), str(path)]) == 0
    registered = (in_tmp / "results" / "studies" / "s" / "registration.json").read_text()
    _spec(in_tmp, test={"kind": "difference", "sign": 1, "alpha": 0.10, "delta": 0.1})  # a looser alpha
    assert study.main(["--no-run", "--results", str(in_tmp / "results"), str(path)]) == 2
    assert "registered test changed" in capsys.readouterr().err
    _spec(in_tmp, metric={"name": "eval/accuracy", "summary": "auc", "scale": 100})
    with pytest.raises(study.StudyError, match="metric"):
        study.check_registration(study.load_study(path), in_tmp / "results", has_finished=True)
    assert (in_tmp / "results" / "studies" / "s" / "registration.json").read_text() == registered
    # a new name is a new study: accepted
    new = _spec(in_tmp, name="s2", metric={"name": "eval/accuracy", "summary": "auc", "scale": 100})
    study.check_registration(study.load_study(new), in_tmp / "results", has_finished=False)


def test_an_unfinished_study_may_still_change_its_design(in_tmp):
    path = _spec(in_tmp)
    study.check_registration(study.load_study(path), in_tmp / "results", has_finished=False)
    _spec(in_tmp, test={"kind": "difference", "sign": -1, "alpha": 0.05, "delta": 0.1})
    study.check_registration(study.load_study(path), in_tmp / "results", has_finished=False)
    reg = json.loads((in_tmp / "results" / "studies" / "s" / "registration.json").read_text())
    assert reg["test"]["sign"] == -1


def test_bad_study_files_are_refused(in_tmp):
    with pytest.raises(study.StudyError, match="file stem"):
        path = _spec(in_tmp)
        path.rename(path.with_name("other.yaml"))
        study.load_study(path.with_name("other.yaml"))
    with pytest.raises(study.StudyError, match="margin"):
        study.load_study(_spec(in_tmp, test={"kind": "equivalence", "alpha": 0.05}))
    with pytest.raises(study.StudyError, match="not an arm"):
        study.load_study(_spec(in_tmp, control="C"))


def test_index_lists_every_study_file_with_its_verdict_or_not_run(in_tmp):
    _store(in_tmp, "s", [("A", s, 30, None, "FINISHED") for s in range(3)]
           + [("B", s, 70, None, "FINISHED") for s in range(3)])
    path = _spec(in_tmp)
    _spec(in_tmp, name="later", not_run="no time on this machine")
    assert study.main(["--no-run", "--results", str(in_tmp / "results"), str(path)]) == 0
    table = (in_tmp / "results" / "STUDIES.md").read_text()
    assert "| `s` | B beats A. |" in table and "reproduced" in table and "+40 [" in table
    assert "| `later` |" in table and "not run (no time on this machine)" in table


def test_power_analysis_is_the_exact_power_of_the_deciding_test():
    # 2 seeds, sd 0.1, margin 0.1: the large-sample formula 2 T(m/se - t) - 1 gave 0 here; the exact
    # TOST power is positive (tests/test_stats.py checks tost_power against a simulation)
    p = study.power_analysis({"kind": "equivalence", "margin": 0.1, "alpha": 0.05}, 0.1, 2)
    assert p["power"] == pytest.approx(stats.tost_power(0.1, 0.1, 2)) and 0.05 < p["power"] < 0.15
    assert stats.tost_power(0.1, 0.1, p["seeds_needed"] - 1) < 0.8 <= stats.tost_power(0.1, 0.1, p["seeds_needed"])
    assert p["sd_lo"] < 0.1 < p["sd_hi"] and p["seeds_needed_lo"] <= p["seeds_needed"] <= p["seeds_needed_hi"]
    assert math.isnan(study.power_analysis({"kind": "difference", "delta": 0.1}, math.nan, 1)["sd"])


def test_readme_table_goes_between_the_markers_only(tmp_path):
    readme = tmp_path / "README.md"
    start, end = study.README_MARKS
    readme.write_text(f"# x\n{start}\nold row\n{end}\nafter\n")
    assert study.update_readme(readme, ["| a |", "|---|"])
    assert readme.read_text() == f"# x\n{start}\n| a |\n|---|\n{end}\nafter\n"
    readme.write_text("no markers\n")
    assert not study.update_readme(readme, ["| a |"]) and readme.read_text() == "no markers\n"
