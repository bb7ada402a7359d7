"""analysis.stats.family: several arms against one control in one study (``comparisons``), each decided
at the Bonferroni level alpha / m; the family-wise rate of a false "reproduced" by simulation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric
from scipy import stats

from analysis import study
from analysis.stats import REPRODUCED, comparison_levels, family_verdicts, sub_spec
from analysis.study.store import run_seconds
from tests.test_study import _log_run, _spec, _store, in_tmp, launched  # noqa: F401 (fixtures)

ARMS = {"A": ["train.lr=1e-7"], "B": ["train.lr=1e-5"], "C": ["train.lr=2e-5"]}


def _drop_treatment(path):
    import yaml

    spec = yaml.safe_load(path.read_text())
    spec.pop("treatment")
    path.write_text(yaml.safe_dump(spec))
    return path


def test_bad_comparisons_are_refused(in_tmp):
    both = _spec(in_tmp, arms=ARMS, comparisons=["B", "C"])  # treatment B still there
    with pytest.raises(study.StudyError, match="either treatment .* or comparisons"):
        study.load_study(both)
    for bad, match in ((["B"], "at least 2 distinct"), (["B", "B"], "at least 2 distinct"),
                       (["A", "B"], "other than the control 'A'"), (["B", "D"], "'D' must be an arm")):
        with pytest.raises(study.StudyError, match=match):
            study.load_study(_drop_treatment(_spec(in_tmp, arms=ARMS, comparisons=bad)))


def test_each_comparison_is_decided_at_alpha_over_m_and_indexed_as_its_own_row(in_tmp):
    """A = 30/100 on every seed; B = 70, 72, 68 (B - A = 0.40 +- 0.02); C = 30, 32, 28 (C - A = 0 +- 0.02).
    m = 2: each paired t interval at 1 - 0.05 / 2, half width t_{0.99375, 2} 0.02 / sqrt 3."""
    path = _drop_treatment(_spec(in_tmp, arms=ARMS, comparisons=["B", "C"]))
    runs = [("A", s, 30, None, "FINISHED") for s in range(3)]
    runs += [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))]
    runs += [("C", s, r, None, "FINISHED") for s, r in zip(range(3), (30, 32, 28))]
    root = _store(in_tmp, "s", runs)
    spec = study.load_study(path)
    res = study.report(spec, path, root, machine="test box")
    half = stats.t.ppf(1 - 0.025 / 2, 2) * 0.02 / math.sqrt(3)
    b, c = res["comparisons"]["B"], res["comparisons"]["C"]
    assert res["correction"] == "bonferroni" and res["m"] == 2
    assert b["level"] == pytest.approx(0.975, abs=1e-15) and c["level"] == pytest.approx(0.975, abs=1e-15)
    assert (b["lo"], b["hi"]) == (pytest.approx(0.40 - half, abs=1e-12), pytest.approx(0.40 + half, abs=1e-12))
    assert (c["lo"], c["hi"]) == (pytest.approx(-half, abs=1e-12), pytest.approx(half, abs=1e-12))
    assert (b["verdict"], c["verdict"], b["seeds_used"], c["seeds_used"]) == ("reproduced", "inconclusive", 3, 3)
    assert (root / "studies" / "s--B.md").exists() and (root / "studies" / "s--C.md").exists()
    assert "B - A" in (root / "studies" / "s--B.md").read_text()
    table = study.index(root, in_tmp / "studies").read_text()
    assert "| `s: B - A` |" in table and "| `s: C - A` |" in table and "[s--C.md](studies/s--C.md)" in table


def test_a_study_without_comparisons_registers_as_before(in_tmp):
    spec = study.load_study(_spec(in_tmp))
    assert "comparisons" not in study.registration(spec) and study.registration(spec)["treatment"] == "B"


def _grid_null(rng, n_studies, m, n_seeds, theta, seed_sd=0.034, n_problems=250, base=0.45):
    """Per-seed paired effects ``[studies, m, seeds]`` of m arms against one shared control: each
    arm-seed's accuracy is binomial(n_problems, base + theta_arm + seed_sd / sqrt 2 z) / n_problems
    (so an arm - control pair spreads by seed_sd plus the problems' noise), the control's runs shared."""
    shift = np.concatenate([[0.0], np.broadcast_to(theta, (m,))])[None, :, None]
    p = np.clip(base + shift + seed_sd / math.sqrt(2) * rng.standard_normal((n_studies, m + 1, n_seeds)), 0, 1)
    acc = rng.binomial(n_problems, p) / n_problems
    return acc[:, 1:] - acc[:, :1]


@pytest.mark.parametrize("kind,theta,boundary", [("difference", 0.0, None), ("difference", 0.0, "obrien_fleming"),
                                                 ("equivalence", 0.05, None),
                                                 ("equivalence", 0.05, "obrien_fleming")])
def test_null_family_wise_false_reproduced_rate_is_at_most_alpha(kind, theta, boundary):
    """2,000 simulated 7-comparison studies (the design card grid's family), every arm at the null:
    no difference (difference test, sign +1) or every arm exactly at the +5-point margin (TOST). The
    rate of studies with at least one false "reproduced" is <= alpha + 3 Monte-Carlo SE; without the
    correction (each comparison at alpha) the same draws exceed it (the check can fail)."""
    rng = np.random.default_rng(45)
    m, S, alpha = 7, 2000, 0.05
    test = ({"kind": "difference", "sign": 1, "alpha": alpha, "delta": 0.05} if kind == "difference"
            else {"kind": "equivalence", "margin": 0.05, "alpha": alpha})
    looks = [4, 6, 8, 10, 12] if boundary else [12]
    x = _grid_null(rng, S, m, looks[-1], theta)
    fam = family_verdicts(x, test, looks, comparison_levels(test, m, looks, boundary))
    rate = (fam["verdict"] == REPRODUCED).any(axis=1).mean()
    se = math.sqrt(alpha * (1 - alpha) / S)
    assert rate <= alpha + 3 * se, rate
    raw = family_verdicts(x, test, looks, comparison_levels(test, 1, looks, boundary))
    raw_rate = (raw["verdict"] == REPRODUCED).any(axis=1).mean()
    assert raw_rate > alpha + 3 * se, raw_rate
    print(f"{kind} {boundary}: family false reproduced {rate:.4f} (uncorrected {raw_rate:.4f}), "
          f"mean seeds {fam['seeds_used'].mean():.2f}")


def test_sub_spec_splits_alpha_and_keeps_the_store():
    spec = {"name": "g", "control": "A", "comparisons": ["B", "C", "D"], "arms": {}, "test": {"kind": "equivalence",
                                                                                            "margin": 0.05, "alpha": 0.05}}
    sub = sub_spec(spec, "C")
    assert sub["treatment"] == "C" and sub["name"] == "g" and "comparisons" not in sub
    assert sub["test"]["alpha"] == 0.05 / 3 and spec["test"]["alpha"] == 0.05
    assert comparison_levels(spec["test"], 3, [10]) == [pytest.approx(2 * 0.05 / 3, abs=1e-16)]


def test_a_sequential_family_runs_only_the_control_and_the_undecided_arms(in_tmp, launched):  # noqa: F811
    """Look 1 (3 of 5 seeds): B - A = 0.40 +- 0.02 is decided (O'Brien-Fleming at 0.05 / 2), C - A =
    0 +- 0.02 is not: the next look launches seeds 3 and 4 for A and C only."""
    seq = {"first": 3, "add": 2, "max_seeds": 5, "boundary": "obrien_fleming"}
    path = _drop_treatment(_spec(in_tmp, arms=ARMS, comparisons=["B", "C"], seeds=(0, 1, 2, 3, 4), sequential=seq))
    runs = [("A", s, 30, None, "FINISHED") for s in range(3)]
    runs += [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))]
    runs += [("C", s, r, None, "FINISHED") for s, r in zip(range(3), (30, 32, 28))]
    root = _store(in_tmp, "s", runs)
    logs = []
    assert study.run_study(study.load_study(path), root, log=logs.append) == [3]  # the fake launches finish nothing
    assert "look at 3 seeds: B reproduced, C inconclusive" in logs
    joined = [" ".join(c) for c in launched]
    assert len(launched) == 2 and all("seed=3,4" in c for c in joined)
    assert any("train.lr=1e-7" in c for c in joined) and any("train.lr=2e-5" in c for c in joined)
    assert not any("train.lr=1e-5" in c for c in joined)


def test_a_resumed_family_labels_an_arm_with_the_look_that_decided_it(in_tmp, launched):  # noqa: F811
    """A resumed study replays its looks with every stored seed. B - A = 0.4, 0.2, 0.6 at the look
    at 3 seeds (O'Brien-Fleming's first level leaves it open), then 0.4, 0.4: decided at 5 seeds.
    The replayed look at 3 names that look rather than claiming B was decided at 3 seeds."""
    seq = {"first": 3, "add": 2, "max_seeds": 5, "boundary": "obrien_fleming"}
    path = _drop_treatment(_spec(in_tmp, arms=ARMS, comparisons=["B", "C"], seeds=(0, 1, 2, 3, 4), sequential=seq))
    runs = [("A", s, 30, None, "FINISHED") for s in range(5)]
    runs += [("B", s, r, None, "FINISHED") for s, r in zip(range(5), (70, 50, 90, 70, 70))]
    runs += [("C", s, r, None, "FINISHED") for s, r in zip(range(5), (30, 32, 28, 30, 30))]
    root = _store(in_tmp, "s", runs)
    spec = study.load_study(path)
    b = study.analyse(sub_spec(spec, "B"), study.load_records(spec, root))
    assert [(r["seeds"], r["decision"]) for r in b["looks"]] == [(3, "inconclusive"), (5, "reproduced")]
    logs = []
    study.run_study(spec, root, log=logs.append)
    assert not launched and "B reproduced (decided at the look at 5 seeds)" in logs[0]
    assert logs[0].startswith("look at 3 seeds: ")


def test_a_comparison_counts_its_own_two_arms_runs_not_the_familys(in_tmp):
    """B - A is decided at the look at 3 of 5 seeds, so B stops at 3 seeds; C - A runs to 5. C's
    report counts A's and C's 10 runs of 10, with no "only ... registered runs finished" caveat from
    B's seeds 3 and 4 that the design never needed."""
    seq = {"first": 3, "add": 2, "max_seeds": 5, "boundary": "obrien_fleming"}
    path = _drop_treatment(_spec(in_tmp, arms=ARMS, comparisons=["B", "C"], seeds=(0, 1, 2, 3, 4), sequential=seq))
    runs = [("A", s, 30, None, "FINISHED") for s in range(5)]
    runs += [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))]
    runs += [("C", s, r, None, "FINISHED") for s, r in zip(range(5), (30, 50, 10, 40, 20))]
    root = _store(in_tmp, "s", runs)
    spec = study.load_study(path)
    records = study.load_records(spec, root)
    c = study.analyse(sub_spec(spec, "C"), records)
    b = study.analyse(sub_spec(spec, "B"), records)
    assert (c["runs_finished"], c["runs_registered"], c["seeds_used"]) == (10, 10, 5)
    assert (b["verdict"], b["runs_finished"], b["runs_registered"], b["seeds_used"]) == ("reproduced", 8, 6, 3)
    assert "registered runs finished" not in study.verdict_text(sub_spec(spec, "C"), c)


def test_readme_table_opens_with_a_family_row_then_each_arm_and_leaves_pilots_to_studies_md(in_tmp):
    """The README's studies table: a study with ``comparisons`` comes first, its own row (its claim
    once, "k of n comparisons decided", the seeds used, its cost, a link to its figure), then one row
    per comparison with that comparison's own claim, effect and verdict; results/STUDIES.md the same.
    A study named in another file's ``pilots`` keeps its row in results/STUDIES.md and leaves the
    README's table for a note, as does a study not run yet."""
    path = _drop_treatment(_spec(in_tmp, name="zgrid", arms=ARMS, comparisons=["B", "C"]))
    runs = [("A", s, 30, None, "FINISHED") for s in range(3)]
    runs += [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))]
    runs += [("C", s, r, None, "FINISHED") for s, r in zip(range(3), (30, 32, 28))]
    _store(in_tmp, "zgrid", runs)
    _spec(in_tmp, name="apilot")
    _spec(in_tmp, name="bsecond", pilots=["apilot"])
    study.report(study.load_study(path), path, study.RESULTS, machine="test box")
    (in_tmp / "README.md").write_text("intro\n" + "\n".join(study.README_MARKS) + "\ntail\n")
    full = study.index(study.RESULTS, in_tmp / "studies").read_text()
    readme = (in_tmp / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| ")][1:]  # past the header
    family = json.loads((in_tmp / "results" / "studies" / "zgrid" / "result.json").read_text())
    # each fake run logged time/elapsed_s 4.0 at its last step and no eval time: 9 x 4 s
    assert family["cost"]["runs"] == 9 and family["cost"]["run_hours"] == pytest.approx(9 * 4 / 3600)
    hours = family["cost"]["run_hours"]
    assert rows[0] == ("| [zgrid: 2 comparisons with A](results/plots/zgrid_arms.png) | B beats A. | 3 seeds used "
                       f"(fixed) x 4 steps, 100 eval problems; 9 runs, {hours:.1f} run-hours | - | "
                       "1 of 2 comparisons decided: B reproduced |")
    assert rows[1].startswith("| [zgrid: B - A](results/studies/zgrid--B.md) | B differs from A in eval/accuracy | "
                              "3 seeds x 4 steps, 100 eval problems | +40 ")
    assert rows[1].endswith("| reproduced |") and rows[2].startswith("| [zgrid: C - A](results/studies/zgrid--C.md)")
    assert rows[3:] == []  # the pilot and the study not run yet left the README's table
    assert "Pilots superseded by a second version" in readme and "`apilot` (bsecond)" in readme
    assert "Registered, not run yet (rows in [results/STUDIES.md](results/STUDIES.md)): `bsecond`." in readme
    assert "| `apilot` |" in full and "| `bsecond` |" in full and readme.endswith("<!-- /studies-table -->\ntail\n")
    zgrid = [line for line in full.splitlines() if line.startswith("| `zgrid")]
    assert zgrid[0].startswith("| `zgrid: 2 comparisons with A` | B beats A. |")
    assert "1 of 2 comparisons decided" in zgrid[0]
    assert [r.split(" | ")[1] for r in zgrid[1:]] == [f"{x} differs from A in eval/accuracy" for x in "BC"]
    # the family's figure: a panel per arm, named under the table
    assert "`zgrid`, every arm vs step: [plots/zgrid_arms.png](results/plots/zgrid_arms.png)." in readme
    assert (in_tmp / "results" / "plots" / "zgrid_arms.png").stat().st_size > 10_000


def test_a_sequential_family_before_its_first_look_leaves_the_readme_table_for_the_note(in_tmp):
    """A sequential family with finished runs but no completed first look (2 of the 3 seeds the first
    look needs) has its rows in results/STUDIES.md only; the README names it in the note with its seeds
    so far, so that a started study does not add its rows before it has a look to show. After the
    first look its rows return."""
    seq = {"first": 3, "add": 2, "max_seeds": 5, "boundary": "obrien_fleming"}
    path = _drop_treatment(_spec(in_tmp, name="sgrid", arms=ARMS, comparisons=["B", "C"],
                                 seeds=(0, 1, 2, 3, 4), sequential=seq))
    runs = [(a, s, 30 + s, None, "FINISHED") for a in ARMS for s in range(2)]
    _store(in_tmp, "sgrid", runs)
    study.report(study.load_study(path), path, study.RESULTS, machine="test box")
    (in_tmp / "README.md").write_text("intro\n" + "\n".join(study.README_MARKS) + "\ntail\n")
    full = study.index(study.RESULTS, in_tmp / "studies").read_text()
    readme = (in_tmp / "README.md").read_text()
    assert [line for line in readme.splitlines() if line.startswith("| ")][1:] == []
    assert ("Started, before their first look (rows in [results/STUDIES.md](results/STUDIES.md)): "
            "`sgrid` (2 of 5 seeds run).") in readme
    assert "| `sgrid: 2 comparisons with A` |" in full
    client = MlflowClient(f"sqlite:///{in_tmp / 'results' / 'studies' / 'sgrid' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grpo-harness").experiment_id
    for a in ARMS:  # the third seed completes the first look
        _log_run(client, exp, "sgrid", a, 2, 30, None, "FINISHED")
    study.report(study.load_study(path), path, study.RESULTS, machine="test box")
    study.index(study.RESULTS, in_tmp / "studies")
    readme = (in_tmp / "README.md").read_text()
    assert "Started, before their first look" not in readme
    assert [line for line in readme.splitlines() if line.startswith("| ")][1].startswith("| [sgrid: 2 comparisons with A]")


def test_a_run_resumed_sessions_later_costs_its_compute_not_the_hours_between(tmp_path):
    """run_seconds: the trainer's time/elapsed_s at the last step (carried over from the checkpoint a
    resumed run starts from) plus the eval logged at that step; MLflow's start-to-end time counts only
    for a run that logged no elapsed time."""
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.create_experiment("x", artifact_location=(tmp_path / "art").as_uri())
    t0 = 1_700_000_000_000
    hour = 3_600_000
    resumed = client.create_run(exp, start_time=t0).info.run_id
    # step 1 in the first session; killed; steps 2-4 three hours later, elapsed carried from step 1
    elapsed = [(1, 46.7, t0 + 47_000), (2, 82.1, t0 + 3 * hour + 36_000), (4, 154.6, t0 + 3 * hour + 117_000)]
    evals = [(0, 0.5, t0 + 1_000), (4, 43.6, t0 + 3 * hour + 117_000)]
    client.log_batch(resumed, metrics=[Metric("time/elapsed_s", v, ts, st) for st, v, ts in elapsed]
                     + [Metric("time/eval_s", v, ts, st) for st, v, ts in evals])
    client.set_terminated(resumed, end_time=t0 + 3 * hour + 118_000)
    assert run_seconds(client, client.get_run(resumed)) == pytest.approx(154.6 + 43.6)  # not 3 h 2 min

    no_final_eval = client.create_run(exp, start_time=t0).info.run_id
    client.log_batch(no_final_eval, metrics=[Metric("time/elapsed_s", 30.0, t0, 2), Metric("time/eval_s", 9.0, t0, 1)])
    client.set_terminated(no_final_eval, end_time=t0 + 60_000)
    assert run_seconds(client, client.get_run(no_final_eval)) == pytest.approx(30.0)  # the step-1 eval is inside

    bare = client.create_run(exp, start_time=t0).info.run_id
    client.set_terminated(bare, end_time=t0 + 120_000)
    assert run_seconds(client, client.get_run(bare)) == pytest.approx(120.0)
    running = client.create_run(exp, start_time=t0).info.run_id
    assert run_seconds(client, client.get_run(running)) == 0.0
