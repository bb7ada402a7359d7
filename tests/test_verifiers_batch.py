"""verify_batch: registry, validation, worker pool reuse, deadlines, failures, threads."""

import threading
import time

import pytest

from harness.verifiers import batch
from harness.verifiers import summarize, verify_batch, Verdict


@pytest.fixture
def warm_pool():
    verify_batch("math", [r"\boxed{1}", r"\boxed{2}"], ["1", "2"], num_workers=2)
    return batch._get_pool()


def _pids(pool):
    return sorted(w.proc.pid for w in pool._workers)


def test_unknown_kind_lists_valid_names():
    with pytest.raises(ValueError) as err:
        verify_batch("mmlu", ["a"], ["b"])
    for name in ("gsm8k", "math", "int"):
        assert name in str(err.value)


def test_length_mismatch_and_bad_args():
    with pytest.raises(ValueError):
        verify_batch("math", ["a", "b"], ["a"])
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        verify_batch("math", ["a"], ["a"], timeout_s=0)
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['timeout_s'\] for 'gsm8k'"):
        verify_batch("gsm8k", ["a"], ["a"], timeout_s=5)  # a deadline the inline kind would ignore
    assert verify_batch("math", [], []) == []


def test_math_verdict_fields():
    verdicts = verify_batch(
        "math", [r"so $\boxed{\frac12}$", "no box: 0.5", r"\boxed{}", r"\boxed{3}"], ["0.5"] * 4
    )
    assert verdicts[0] == Verdict(True, True, r"\frac12", "ok")
    assert verdicts[1] == Verdict(False, False, None, "ok")
    assert verdicts[2].correct is False and verdicts[2].formatted is False
    assert verdicts[3] == Verdict(False, True, "3", "ok")


def test_pool_is_reused_across_calls(warm_pool):
    before = _pids(warm_pool)
    verify_batch("math", [r"\boxed{4}"] * 6, ["4"] * 6, num_workers=2)
    assert batch._get_pool() is warm_pool
    assert _pids(warm_pool) == before


def test_slow_item_times_out_and_others_come_back(warm_pool, monkeypatch):
    real_job = batch._math_job

    def job(answer, gold):
        return {"op": "sleep", "seconds": 60} if answer == "SLOW" else real_job(answer, gold)

    monkeypatch.setattr(batch, "_math_job", job)
    completions = [r"\boxed{1}", r"\boxed{SLOW}", r"\boxed{3}", r"\boxed{0.5}", r"\boxed{4}"]
    golds = ["1", "1", "3", r"\frac12", "5"]
    start = time.monotonic()
    verdicts = verify_batch("math", completions, golds, timeout_s=1.5, num_workers=2)
    elapsed = time.monotonic() - start
    assert verdicts[1] == Verdict(False, True, "SLOW", "timeout")
    assert [v.correct for v in verdicts] == [True, False, True, True, False]
    assert [v.status for v in verdicts] == ["ok", "timeout", "ok", "ok", "ok"]
    assert elapsed < 1.5 + 10.0  # deadline + worker replacement, never the 60 s sleep
    assert summarize(verdicts)["verifier/timeouts"] == 1.0
    # the killed worker was replaced; the pool keeps working
    assert len(warm_pool._workers) >= 2
    assert verify_batch("math", [r"\boxed{7}"], ["7"])[0].correct


def test_batch_budget_bounds_a_batch_of_slow_items(warm_pool, monkeypatch):
    from harness.verifiers import _pool

    monkeypatch.setattr(batch, "_math_job", lambda answer, gold: {"op": "sleep", "seconds": 60})
    monkeypatch.setattr(_pool, "BATCH_SLACK_S", 0.5)
    start = time.monotonic()
    verdicts = verify_batch("math", [rf"\boxed{{{i}}}" for i in range(8)], ["0"] * 8, timeout_s=1.0, num_workers=2)
    elapsed = time.monotonic() - start
    assert [v.status for v in verdicts] == ["timeout"] * 8
    assert elapsed < 1.0 * 4 + 0.5 + 3.0  # budget + the in-flight items' own deadline + slack


def test_worker_crash_and_exception_become_errors(warm_pool, monkeypatch):
    real_job = batch._math_job

    def job(answer, gold):
        if answer == "CRASH":
            return {"op": "exit"}
        if answer == "RAISE":
            return {"op": "raise"}
        return real_job(answer, gold)

    monkeypatch.setattr(batch, "_math_job", job)
    verdicts = verify_batch(
        "math", [r"\boxed{CRASH}", r"\boxed{2}", r"\boxed{RAISE}", r"\boxed{4}"], ["1", "2", "3", "4"], timeout_s=5
    )
    assert [v.status for v in verdicts] == ["error", "ok", "error", "ok"]
    assert [v.correct for v in verdicts] == [False, True, False, True]
    assert "deliberate" in verdicts[2].detail
    stats = summarize(verdicts)
    assert stats["verifier/errors"] == 2.0 and stats["verifier/accuracy"] == 0.5


def test_bad_gold_type_is_an_error_not_a_crash():
    verdicts = verify_batch("math", [r"\boxed{1}", r"\boxed{2}"], [None, "2"])
    assert [v.status for v in verdicts] == ["error", "ok"]
    verdicts = verify_batch("gsm8k", ["#### 1", None], ["1", "1"])
    assert [v.status for v in verdicts] == ["ok", "error"]


def test_verify_batch_from_threads():
    results, errors = {}, []

    def work(i):
        try:
            results[i] = verify_batch(
                "math", [rf"\boxed{{{i}}}", r"\boxed{0.25}"], [str(i), r"\frac14"], timeout_s=10
            )
            results[(i, "g")] = verify_batch("gsm8k", [f"#### {i}"], [str(i)])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    for i in range(3):
        assert [v.correct for v in results[i]] == [True, True]
        assert results[(i, "g")][0].correct


def test_shutdown_then_restart():
    verify_batch("math", [r"\boxed{1}"], ["1"])
    batch.shutdown_pool()
    assert batch._pool is None
    assert verify_batch("math", [r"\boxed{1}"], ["1"])[0].correct


def test_summarize_empty_and_counts():
    assert summarize([])["verifier/n"] == 0.0
    stats = summarize([Verdict(True, True, "1", "ok"), Verdict(False, True, "2", "timeout")])
    assert stats == {
        "verifier/n": 2.0,
        "verifier/correct": 1.0,
        "verifier/accuracy": 0.5,
        "verifier/format_rate": 1.0,
        "verifier/timeouts": 1.0,
        "verifier/errors": 0.0,
    }
