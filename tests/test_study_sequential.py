"""analysis.study: the minimum design of a new registration, sequential study files (checks, the run
loop look by look, the looks in the report, the frozen boundary). The error rates of the rule are
simulated in tests/test_seedtest.py."""

from __future__ import annotations

import pytest
from scipy import stats

from analysis import study
from analysis.stats import nominal_levels, z_nominal_levels
from analysis.study import spec as study_spec
from tests.test_study import _spec, _store, in_tmp, launched  # noqa: F401 (fixtures)

SEQ = {"first": 3, "add": 2, "max_seeds": 5, "boundary": "obrien_fleming"}


def _seq_spec(tmp, **kw):
    return _spec(tmp, seeds=(0, 1, 2, 3, 4), sequential=kw.pop("sequential", SEQ), **kw)


def test_a_new_registration_below_the_minimum_is_refused(in_tmp, capsys):
    results = str(in_tmp / "results")
    two = _spec(in_tmp, name="two", seeds=(0, 1))
    assert study.main(["--no-run", "--results", results, str(two)]) == 2
    err = capsys.readouterr().err
    assert "two.yaml: seeds gives 2 seeds per arm; a new study needs at least 3" in err
    seq = _spec(in_tmp, name="sq", seeds=(0, 1, 2, 3), sequential={**SEQ, "first": 2, "max_seeds": 4})
    with pytest.raises(study.StudyError, match="sq.yaml: sequential.first gives 2 seeds"):
        study.check_registration(study.load_study(seq), in_tmp / "results")
    window = _spec(in_tmp, name="w", steps=3, metric={"name": "train/entropy", "summary": "last_third", "scale": 1})
    with pytest.raises(study.StudyError, match="w.yaml: steps 3 gives a last_third window of 1 step"):
        study.check_registration(study.load_study(window), in_tmp / "results")
    # a committed study that already ran with 2 seeds stays loadable and is reported below the minimum
    _store(in_tmp, "two", [(a, s, r, None, "FINISHED") for a, r in (("A", 30), ("B", 70)) for s in (0, 1)])
    assert study.main(["--no-run", "--results", results, str(two)]) == 0
    assert "(2 seeds: below the 3-seed minimum)" in (in_tmp / "results" / "studies" / "two.md").read_text()


def test_bad_sequential_blocks_are_refused(in_tmp):
    for bad, match in (({**SEQ, "extra": 1}, "exactly the keys"), ({**SEQ, "boundary": "haybittle"}, "boundary"),
                       ({**SEQ, "max_seeds": 6}, "must list sequential.max_seeds = 6"),
                       ({**SEQ, "first": 0}, "sequential.first must be a positive integer")):
        with pytest.raises(study.StudyError, match=match):
            study.load_study(_seq_spec(in_tmp, sequential=bad))


def test_a_decided_first_look_stops_the_study(in_tmp, launched):
    """Seeds 0-2: B - A = 0.40, 0.42, 0.38. Look 1 (3 of 5 seeds, information 0.6): O'Brien-Fleming
    spends 2 - 2 Phi(1.96 / sqrt 0.6) = 0.0114; the t interval at that level lies above 0."""
    root = _store(in_tmp, "s", [("A", s, 30, None, "FINISHED") for s in range(3)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (70, 72, 68))])
    spec = study.load_study(_seq_spec(in_tmp))
    assert study.run_study(spec, root, log=lambda m: None) == [3] and launched == []
    res = study.report(spec, _seq_spec(in_tmp), root, machine="test box")
    a1 = 2 - 2 * stats.norm.cdf(stats.norm.ppf(0.975) / 0.6 ** 0.5)
    assert res["looks"][0]["alpha"] == pytest.approx(a1, rel=1e-6) and len(res["looks"]) == 1
    half = stats.t.ppf(1 - a1 / 2, 2) * 0.02 / 3 ** 0.5
    assert (res["lo"], res["hi"]) == (pytest.approx(0.40 - half, abs=1e-10), pytest.approx(0.40 + half, abs=1e-10))
    assert res["verdict"] == "reproduced" and res["seeds_used"] == 3 and res["level"] == pytest.approx(1 - a1)
    text = (root / "studies" / "s.md").read_text()
    assert "**Verdict: reproduced.**" in text  # 6 runs: all that the look it stopped at registers
    assert f"| 1 | 3 | {a1:.4g} | +40 [+{100 * (0.4 - half):.3g}, +{100 * (0.4 + half):.3g}] | reproduced |" in text
    levels = nominal_levels("obrien_fleming", [3, 5], 0.05)  # the last look spends the rest
    assert f"| 2 | 5 | {levels[1]:.4g} | - | not reached |" in text and 0.04 < levels[1] < 0.05


def test_an_undecided_look_launches_the_next_seeds(in_tmp, launched):
    """Look 1 inconclusive (effects -2, 0, +2 problems): the study adds seeds 3 and 4 to both arms."""
    root = _store(in_tmp, "s", [("A", s, 40, None, "FINISHED") for s in range(3)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(3), (38, 40, 42))])
    spec = study.load_study(_seq_spec(in_tmp))
    logs = []
    assert study.run_study(spec, root, log=logs.append) == [3]  # the fake launches finish nothing
    assert [c for c in launched[0] if c.startswith("seed=")] == ["seed=3,4"] and len(launched) == 2
    assert "look at 3 seeds: inconclusive" in logs
    res = study.report(spec, _seq_spec(in_tmp), root, machine="test box")
    assert res["verdict"] == "inconclusive" and "after the look at 3 of up to 5 seeds" in study.verdict_text(spec, res)
    assert "| 2 | 5 |" in (root / "studies" / "s.md").read_text() and "not run yet" in (root / "studies" / "s.md").read_text()


def test_a_fixed_design_runs_as_before(in_tmp, launched):
    root = in_tmp / "results"
    spec = study.load_study(_spec(in_tmp))
    assert study.run_study(spec, root, log=lambda m: None) == [3]
    assert sorted(c for cmd in launched for c in cmd if c.startswith("seed=")) == ["seed=0,1,2"] * 2


def test_a_changed_sequential_block_is_refused_after_the_first_look(in_tmp, capsys):
    _store(in_tmp, "s", [(a, s, r, None, "FINISHED") for a, r in (("A", 30), ("B", 70)) for s in range(3)])
    results = str(in_tmp / "results")
    path = _seq_spec(in_tmp)
    assert study.main(["--no-run", "--results", results, str(path)]) == 0
    _seq_spec(in_tmp, sequential={**SEQ, "boundary": "pocock"})
    assert study.main(["--no-run", "--results", results, str(path)]) == 2
    assert "registered sequential changed" in capsys.readouterr().err


def test_inconclusive_at_max_seeds_says_what_the_seeds_exclude(in_tmp):
    """Every look taken and still undecided: the verdict names the effects the last interval excludes."""
    root = _store(in_tmp, "s", [("A", s, 40, None, "FINISHED") for s in range(5)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(5), (38, 40, 42, 44, 36))])
    spec = study.load_study(_seq_spec(in_tmp))
    res = study.report(spec, _seq_spec(in_tmp), root, machine="test box")
    assert [r["seeds"] for r in res["looks"]] == [3, 5] and res["verdict"] == "inconclusive"
    # look 2: effects -2, 0, 2, 4, -4 points, mean 0, sd sqrt(10) points, at the last look's nominal alpha
    a2 = nominal_levels("obrien_fleming", [3, 5], 0.05)[1]
    half = stats.t.ppf(1 - a2 / 2, 4) * 0.1 ** 0.5 / 10 / 5 ** 0.5
    assert (res["lo"], res["hi"]) == (pytest.approx(-half, abs=1e-10), pytest.approx(half, abs=1e-10))
    assert study.verdict_text(spec, res).endswith(
        f"at max_seeds 5: the last look's interval excludes effects below {100 * -half:+.3g} and above {100 * half:+.3g}")



def test_a_verdict_the_t_boundaries_change_names_the_z_verdict_beside_it(in_tmp, monkeypatch):
    """B - A = -2, 6, 8, 8, 8 points: look 1 (3 seeds) undecided; at look 2 (5 seeds) T = 2.888 lies
    between the z level's t critical value (2.866) and the t boundary's (2.959). A study whose runs
    started before the t boundaries names the z verdict and interval beside the re-issued one."""
    root = _store(in_tmp, "s", [("A", s, 40, None, "FINISHED") for s in range(5)]
                  + [("B", s, r, None, "FINISHED") for s, r in zip(range(5), (38, 46, 48, 48, 48))])
    spec = study.load_study(_seq_spec(in_tmp))
    res = study.report(spec, _seq_spec(in_tmp), root, machine="test box")  # runs started today: no note
    assert res["verdict"] == "inconclusive" and res["z_boundaries"]["verdict"] == "reproduced"
    assert "verdict_before_t" not in res and "re-issued" not in res["verdict_text"]
    # the same runs, as if issued under the z boundaries
    monkeypatch.setitem(study_spec.RULE_CHANGES, "t_boundaries", {"since": "9999"})
    res = study.report(spec, _seq_spec(in_tmp), root, machine="test box")
    a2 = z_nominal_levels("obrien_fleming", [3, 5], 0.05)[1]
    d = [-0.02, 0.06, 0.08, 0.08, 0.08]
    mean, sd = sum(d) / 5, stats.tstd(d)
    half = stats.t.ppf(1 - a2 / 2, 4) * sd / 5 ** 0.5
    z = res["verdict_before_t"]
    assert (z["verdict"], z["seeds"]) == ("reproduced", 5)
    assert (z["lo"], z["hi"]) == (pytest.approx(mean - half, abs=1e-10), pytest.approx(mean + half, abs=1e-10))
    note = (f"; re-issued under the t boundaries: the z boundaries used before 9999 read \"reproduced\" at 5 seeds, "
            f"+5.6 [+{100 * (mean - half):.3g}, +{100 * (mean + half):.3g}]")
    assert res["verdict_text"].startswith("inconclusive at max_seeds 5") and res["verdict_text"].endswith(note)
    assert f"**Verdict: {res['verdict_text']}.**" in (root / "studies" / "s.md").read_text()
