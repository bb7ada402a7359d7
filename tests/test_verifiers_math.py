"""MATH verifier: boxed extraction, the string normaliser, direct checks and safety."""

import subprocess
import sys
import time

import pytest

from harness.verifiers import (
    answers_equivalent,
    extract_boxed,
    has_boxed,
    math_correct,
    normalize_answer,
    verify_batch,
)
from harness.verifiers.math import ungroup_thousands

BOXED = [
    (r"so the answer is $\boxed{5}$.", "5"),
    (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
    (r"first \boxed{1} then \boxed{2}", "2"),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"\left( 3, \frac{\pi}{2} \right)"),
    (r"\fbox{7}", "7"),
    (r"\boxed{1} and finally \fbox{9}", "9"),
    (r"$\boxed 5$", "5"),
    (r"\boxed 42 is it", "42"),
    (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces do not count
    (r"\boxed{ 12 }", "12"),
    (r"\boxed{}", ""),
    (r"no box here", None),
    (r"\boxed{unbalanced", None),
    (r"\boxedfoo{3}", None),
    (r"\boxed{\text{(B)}}", r"\text{(B)}"),
    ("\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
]


@pytest.mark.parametrize("text,expected", BOXED)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_has_boxed():
    assert has_boxed(r"\boxed{3}")
    assert not has_boxed(r"\boxed{}")
    assert not has_boxed("3")
    assert not has_boxed(None)


NORMALIZE = [
    (r"\left( 3, \frac{\pi}{2} \right)", r"(3,\frac{\pi}{2})"),
    (r"\dfrac{1}{2}", "1/2"),
    (r"\tfrac12", "1/2"),
    ("0.5", "1/2"),
    (".5", "1/2"),
    ("10.00", "10"),
    (r"\frac{4}{8}", "1/2"),
    (r"11\sqrt2", r"11\sqrt{2}"),
    (r"30^\circ", "30"),
    (r"30^{\circ}", "30"),
    (r"5\text{ cm}", "5"),
    (r"864 \mbox{ inches}^2", "864"),
    (r"\$32,\!348", "32348"),
    (r"10,\!080", "10080"),
    (r"1{,}000", "1000"),
    ("1,2", "1,2"),
    (r"10\%", "10"),
    ("x=5", "5"),
    (r"\text{(B)}", "B"),
    (r"\text{Evelyn}", "Evelyn"),
    (r"0.\overline{3}", "1/3"),
    (r"\boxed{7}", "7"),
    ("-3/4", "-3/4"),
]


@pytest.mark.parametrize("raw,expected", NORMALIZE)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_ungroup_thousands_convention():
    assert ungroup_thousands("1,000") == "1000"
    assert ungroup_thousands(r"11,\! 111,\! 111,\! 100") == "11111111100"
    assert ungroup_thousands(r"2\,000") == "2000"
    assert ungroup_thousands("1,2") == "1,2"
    assert ungroup_thousands("100, 200") == "100, 200"
    assert ungroup_thousands("(1,000)") == "(1,000)"


def test_answers_equivalent_direct():
    assert answers_equivalent(r"\frac{1}{2}", "0.5")
    assert answers_equivalent("5", r"\boxed{5}")  # a gold solution is reduced to its box
    assert not answers_equivalent("", "0")
    assert not answers_equivalent("1" * 3000, "1")
    with pytest.raises(TypeError):
        answers_equivalent(None, "1")


def test_math_correct_bounded():
    assert math_correct(r"The answer is $\boxed{\frac{3}{2}}$.", r"1\frac{1}{2}")
    assert not math_correct("The answer is 3/2.", r"\frac32")  # no box -> False
    assert not math_correct(r"\boxed{2}", "3")


INJECTIONS = [
    r"\boxed{__import__('os').system('touch {p}')}",
    r"\boxed{exec(\"open('{p}','w')\")}",
    r"\boxed{eval('__import__(\"os\").system(\"touch {p}\")')}",
    r"\boxed{\text{__import__('os').system('touch {p}')}}",
    r"\boxed{os.system('touch {p}')} and __import__('os').system('touch {p}') = 5",
    r"\boxed{lambda: __import__('os').system('touch {p}')}",
]


def test_injection_strings_are_never_executed(tmp_path, monkeypatch):
    # The text under test holds no digit of the environment: the target is a relative name, so
    # the temp path (pytest-0 on a new machine) can never feed the last-number fallback a "0".
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "pwned"
    completions = [s.replace("{p}", "pwned") for s in INJECTIONS]
    assert not any(ch.isdigit() for c in completions for ch in c.replace("= 5", ""))
    for kind in ("math", "gsm8k"):
        bounds = {"timeout_s": 5.0} if kind == "math" else {}  # the inline kinds take no deadline
        verdicts = verify_batch(kind, completions, ["0"] * len(completions), **bounds)
        assert not any(v.correct for v in verdicts)
        assert all(v.status in ("ok", "error") for v in verdicts)
    from harness.verifiers import safe_eval, step_rewards

    for c in completions:
        assert safe_eval(c) is None
        step_rewards(c)
    assert not target.exists()


def test_exponent_tower_returns_within_deadline():
    verify_batch("math", [r"\boxed{1}"], ["1"])  # warm the pool: start-up is not the deadline
    deadline = 2.0
    start = time.monotonic()
    verdicts = verify_batch(
        "math", [r"\boxed{9^{9^{9^9}}}", r"\boxed{2}"], ["1", "2"], timeout_s=deadline, num_workers=2
    )
    elapsed = time.monotonic() - start
    assert elapsed < deadline + 3.0
    assert verdicts[0].correct is False and verdicts[0].status in ("timeout", "ok", "error")
    assert verdicts[1].correct is True and verdicts[1].status == "ok"


def test_verifiers_do_not_import_torch_or_sympy():
    code = (
        "import sys, harness.verifiers as v; "
        "v.verify_batch('gsm8k', ['#### 1'], ['1']); v.step_rewards('1+1 = 2'); "
        "v.extract_boxed('\\\\boxed{1}'); v.normalize_answer('1'); "
        "bad = [m for m in ('torch', 'sympy', 'math_verify') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_explosive_answers_are_prescreened_fast():
    from harness.verifiers.math import _explosive

    assert _explosive("9^{9^{9^9}}") and _explosive("10^{10^{10}}") and _explosive("10^{10}!")
    assert not any(_explosive(a) for a in ("2^{2005}", "2^{2^{20}}", "2^{n^2}", "100!", "10^{10}"))
    start = time.monotonic()
    assert not answers_equivalent("9^{9^{9^9}}", "1")  # in-process: would hang without it
    assert answers_equivalent("9^{9^{9^9}}", "9^{9^{9^9}}")  # identical strings still match
    assert time.monotonic() - start < 1.0
