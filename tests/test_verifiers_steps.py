"""Safe arithmetic evaluation and per-step arithmetic rewards."""

import json
import time
from fractions import Fraction

import pytest

from harness.verifiers import safe_eval, split_steps, step_rewards
from tests.conftest import DATA, full_data

EVAL = [
    ("48/2", Fraction(24)),
    ("48 + 24", Fraction(72)),
    ("(3 + 4) * 2", Fraction(14)),
    ("3 x 4", Fraction(12)),
    ("3×4", Fraction(12)),
    ("12 ÷ 4", Fraction(3)),
    ("2·5", Fraction(10)),
    ("-1.5*4", Fraction(-6)),
    ("--3", Fraction(3)),
    ("-(2+3)", Fraction(-5)),
    ("2(3+4)", Fraction(14)),
    ("$1,200 / 4", Fraction(300)),
    ("1,234,567 - 1", Fraction(1234566)),
    ("0.1 + 0.2", Fraction(3, 10)),
    ("1/3 + 1/3 + 1/3", Fraction(1)),
    ("2^10", Fraction(1024)),
    ("2**3", Fraction(8)),
    ("2^3^2", Fraction(512)),  # right-associative
    ("-2^2", Fraction(-4)),
    ("2^-1", Fraction(1, 2)),
    ("50%", Fraction(1, 2)),
    ("20% * 50", Fraction(10)),
    ("7 − 2", Fraction(5)),  # Unicode minus
    (".5 * 4", Fraction(2)),
    (" 42 ", Fraction(42)),
]


@pytest.mark.parametrize("expr,expected", EVAL)
def test_safe_eval(expr, expected):
    assert safe_eval(expr) == expected


REJECT = [
    "__import__('os').system('touch /tmp/pwned')",
    "os.system('ls')",
    "a + 1",
    "abs(-3)",
    "[1, 2]",
    "1,2",  # not a thousands group
    "1 / 0",
    "0^-1",
    "2^0.5",  # non-integer exponent
    "9^9^9^9",  # exponent tower: refused, not computed
    "10^100000",
    "(2^4096)^4096",
    "1" * 100,  # number too long
    "(" * 200 + "1" + ")" * 200,  # too deep
    "-" * 300 + "1",
    "1 +",
    "(1 + 2",
    "1 2",
    "",
    "   ",
    "1 = 1",
    "x",
]


@pytest.mark.parametrize("expr", REJECT)
def test_safe_eval_rejects(expr):
    start = time.monotonic()
    assert safe_eval(expr) is None
    assert time.monotonic() - start < 0.5


def test_safe_eval_type_error():
    with pytest.raises(TypeError):
        safe_eval(3)


THREE_STEPS = (
    "Natalia sold 48/2 = 24 clips in May.\n"
    "Altogether she sold 48 + 24 = 73 clips.\n"
    "So the answer is 72.\n"
    "#### 72"
)


def test_step_rewards_three_steps_one_wrong():
    rewards = step_rewards(THREE_STEPS)
    first_end = THREE_STEPS.index("\n")
    second_end = THREE_STEPS.index("\n", first_end + 1)
    assert rewards == [(first_end, 1.0), (second_end, 0.0)]


def test_step_rewards_calculator_annotations():
    text = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
        "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n"
        "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
        "Wrong: <<5*5=24>>24 apples.\n"
        "#### 72"
    )
    ends = [i for i, c in enumerate(text) if c == "\n"]
    assert step_rewards(text) == [(ends[0], 1.0), (ends[1], 1.0), (ends[2], 1.0), (ends[3], 0.0)]


@pytest.mark.parametrize(
    "step,expected",
    [
        ("2 * 6 = 12 = 3 * 4", 1.0),  # chain: every '=' is checked
        ("2 * 6 = 12 = 3 * 5", 0.0),
        ("She pays $5 + $3 = $8 in total", 1.0),
        ("Each costs 10/3 = 3.33 dollars", 1.0),  # rhs is lhs rounded to its decimals
        ("Each costs 10/3 = 3.3 dollars", 1.0),
        ("Each costs 10/3 = 3.4 dollars", 0.0),
        ("1/4 * 100 = 25%", 1.0),
        ("The area is 3 x 4 = 12 square feet", 1.0),
        ("1,200 + 300 = 1,500", 1.0),
        ("1,200 + 300 = 1,600", 0.0),
        ("(3 + 4) × 2 = 14", 1.0),
        ("Then 5 - 2 = 3, and 3 * 3 = 9", 1.0),
        ("Then 5 - 2 = 3, and 3 * 3 = 10", 0.0),
    ],
)
def test_step_rewards_single_step(step, expected):
    assert step_rewards(step) == [(len(step), expected)]


@pytest.mark.parametrize(
    "step",
    [
        "Let x = the number of apples",
        "x = 5",
        "2x + 3 = 11",  # algebra, not arithmetic
        "20% of 50 = 10",  # lhs continues to the left in words
        "3 apples + 4 apples = 7 apples",
        "So the answer is 72.",
        "if a == b then",
        "48/2 = 2x",  # rhs glued to a variable
    ],
)
def test_step_rewards_skips_uncheckable_steps(step):
    assert step_rewards(step) == []


def test_split_steps_lines_and_sentences():
    text = "First, 2 + 2 = 4. Then 4 * 3 = 12.\n\n  Finally 12 - 1 = 11.  \n"
    spans = split_steps(text)
    assert [text[s:e] for s, e in spans] == ["First, 2 + 2 = 4.", "Then 4 * 3 = 12.", "Finally 12 - 1 = 11."]
    rewards = step_rewards(text)
    assert [r for _, r in rewards] == [1.0, 1.0, 1.0]
    assert [e for e, _ in rewards] == [e for _, e in spans]


def test_step_rewards_injection_and_huge_input_are_safe():
    assert step_rewards("__import__('os').system('x') = 0") == []
    assert step_rewards("9^9^9^9 = 1") == []
    start = time.monotonic()
    step_rewards(("12 + 3 = 15. " * 2000) + "\n" + "1" * 100000 + " = 1")
    step_rewards(("1+" * 100 + " = 5 ") * 80)  # every candidate fails late
    step_rewards(("1 + (" * 60 + "1 = 5 ") * 300)  # unbalanced parentheses
    assert time.monotonic() - start < 5.0


def test_mixed_numbers_and_en_dash():
    assert safe_eval("8 x 1 1/2") == 12
    assert safe_eval("2 + 1 1/2") == Fraction(7, 2)
    assert safe_eval("1 3/2") is None  # improper "mixed number" is not accepted
    assert safe_eval("$2,430 – $2,100") == 330
    assert step_rewards("She needs 2 + 1 1/2 = 3 1/2 square feet") == [(39, 1.0)]


@pytest.mark.parametrize("whole", [False, pytest.param(True, marks=pytest.mark.full_data)], ids=["fixture", "whole"])
def test_reference_solutions_score_almost_all_steps_correct(whole):
    """GSM8K's reference solutions: the fixture's 200 test problems and, where named, all 1,319."""
    rows = [json.loads(line) for line in ((full_data("gsm8k") if whole else DATA / "gsm8k") / "test.jsonl")
            .read_text().splitlines() if line.strip()]
    rewards = [r for row in rows for _, r in step_rewards(row["answer"])]
    assert len(rewards) > 3 * len(rows)  # nearly every solution has checkable steps
    # the few 0.0s are real slips in the reference data (e.g. "100 * 0.75 = $0.75")
    assert sum(rewards) / len(rewards) > 0.99
