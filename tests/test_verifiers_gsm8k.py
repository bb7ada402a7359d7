"""GSM8K / integer numeric verifiers: extraction, exact parsing, correctness."""

from fractions import Fraction

import pytest

from harness.verifiers import (
    extract_gsm8k_answer,
    format_number,
    gsm8k_correct,
    has_gsm8k_format,
    int_correct,
    parse_number,
    verify_batch,
)

GSM8K_GOLD = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

EXTRACT = [
    ("#### 72", "72"),
    ("She sold 72 clips.\n#### 72", "72"),
    ("#### 72 clips.", "72"),
    ("####72", "72"),
    ("The total is 5 + 3 = 8.\n#### 8", "8"),
    ("#### $1,234.50", "1234.5"),
    ("She has $1,234.50 left.", "1234.5"),
    ("#### -5", "-5"),
    ("The temperature drops to -5 degrees.", "-5"),
    ("#### \u22127", "-7"),  # Unicode minus sign
    ("#### $-5", "-5"),
    ("#### -$5", "-5"),
    ("The answer is 10.00", "10"),
    ("#### 10.50", "10.5"),
    ("#### 0.5", "0.5"),
    ("It costs .5 dollars", "0.5"),
    ("72 clips.", "72"),
    ("So the answer is 18.", "18"),
    ("First 3, then 4, finally 5 apples", "5"),  # last-number fallback
    ("#### 1 #### 2 apples", "2"),  # the last #### wins
    ("#### 7\nmore text 99", "7"),  # #### beats the later number
    ("no number here", None),
    ("", None),
    ("#### ", None),
    ("#### no answer", None),
    ("She ate 3/4 of the pie", "0.75"),
    ("#### 1/3", "1/3"),
    ("#### 25%", "25"),
    ("The discount is 25%.", "25"),
    ("#### 1,000,000", "1000000"),
    ("roots 1,2", "2"),  # 1,2 is not a thousands group
    ("8 - 3 is the difference", "3"),  # "- 3" is subtraction, not a negative number
    ("x2 and v1.5", None),  # digits glued to letters are not numbers
    ("pages 10\u201320", "20"),  # en dash is a range, not a minus
    ("5/0 makes no sense", None),
    ("#### 0", "0"),
    ("#### 007", "7"),
    ("#### 3.14159", "3.14159"),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extract_gsm8k_answer(text, expected):
    assert extract_gsm8k_answer(text) == expected


PARSE = [
    ("72", Fraction(72)),
    ("-5", Fraction(-5)),
    ("$1,234.50", Fraction(246900, 200)),
    ("10.00", Fraction(10)),
    ("18.", Fraction(18)),
    ("3/4", Fraction(3, 4)),
    ("25%", Fraction(25)),
    (" 7 ", Fraction(7)),
    ("-$5", Fraction(-5)),
    ("\u22123", Fraction(-3)),
    ("0.1", Fraction(1, 10)),
    ("1,2", None),
    ("1/0", None),
    ("abc", None),
    ("", None),
    ("1" * 500, None),
    (None, None),
    (12, Fraction(12)),
]


@pytest.mark.parametrize("s,expected", PARSE)
def test_parse_number(s, expected):
    assert parse_number(s) == expected


def test_parse_number_exact_no_float_trap():
    assert parse_number("0.1") + parse_number("0.2") == parse_number("0.3")
    with pytest.raises(TypeError):
        parse_number(0.5)


def test_format_number():
    assert format_number(Fraction(10)) == "10"
    assert format_number(Fraction(-5, 2)) == "-2.5"
    assert format_number(Fraction(1, 3)) == "1/3"
    assert format_number(Fraction(1, 8)) == "0.125"
    assert format_number(Fraction(-1, 40)) == "-0.025"


CORRECT = [
    ("#### 72", GSM8K_GOLD, True),
    ("#### 72", "72", True),
    ("The answer is 72 clips.", "72", True),
    ("#### 72.00", "72", True),
    ("#### $72", "72", True),
    ("#### 71", GSM8K_GOLD, False),
    ("#### 1,234", "1234", True),
    ("#### 1234", "1,234", True),
    ("#### -5", "-5", True),
    ("#### 5", "-5", False),
    ("#### 0.75", "3/4", True),
    ("#### 3/4", "0.75", True),
    ("I am not sure.", "72", False),
    ("#### 72 #### 73", "72", False),
    ("#### 10", "10.0", True),
]


@pytest.mark.parametrize("completion,gold,expected", CORRECT)
def test_gsm8k_correct(completion, gold, expected):
    assert gsm8k_correct(completion, gold) is expected


def test_gsm8k_bad_gold_raises():
    with pytest.raises(ValueError):
        gsm8k_correct("#### 5", "no number")


def test_has_gsm8k_format():
    assert has_gsm8k_format("so #### 72")
    assert has_gsm8k_format("#### -3")
    assert has_gsm8k_format("#### $1,000")
    assert not has_gsm8k_format("The answer is 72")
    assert not has_gsm8k_format("#### seventy-two")
    assert not has_gsm8k_format(None)


def test_int_correct():
    assert int_correct("#### 1000", 1000)
    assert int_correct("#### 1,000", "1000")
    assert int_correct("The result is 1000.0", 1000)
    assert not int_correct("#### 999", 1000)
    assert not int_correct("#### 1000.5", 1000)
    assert int_correct("#### -17", "-17")
    with pytest.raises(ValueError):
        int_correct("#### 1", "1.5")


def test_verify_batch_gsm8k_and_int():
    completions = ["#### 72", "The answer is 72.", "#### 71", "nothing"]
    verdicts = verify_batch("gsm8k", completions, [GSM8K_GOLD] * 4)
    assert [v.correct for v in verdicts] == [True, True, False, False]
    assert [v.formatted for v in verdicts] == [True, False, True, False]
    assert [v.extracted for v in verdicts] == ["72", "72", "71", None]
    assert all(v.status == "ok" for v in verdicts)
    ints = verify_batch("int", ["#### 12", "#### 13", "#### 12"], ["12", "12", "1.5"])
    assert [v.correct for v in ints] == [True, False, False]
    assert [v.status for v in ints] == ["ok", "ok", "error"]  # non-integer gold is an error
