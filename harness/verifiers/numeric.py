"""Numeric answer verifiers for GSM8K-style tasks and integer arithmetic tasks.

Conventions (GSM8K, Cobbe et al. 2021, arXiv:2110.14168): the reference solution ends with
``#### <number>``; the number is written without units and may contain ``,`` thousands
separators. Model completions are scored by extracting the number after the *last* ``####``
(the "strict" form used by common GSM8K evaluators), falling back to the last number in the
text when no ``####`` is present ("flexible" extraction).

All comparisons are exact: numbers are parsed into :class:`fractions.Fraction` from their
digit strings (never through ``float``), so ``10.00 == 10`` and ``0.1 + 0.2``-style float
traps cannot occur. Nothing here evaluates model text; parsing is done with regular
expressions that run in linear time.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

__all__ = [
    "extract_gsm8k_answer",
    "format_number",
    "gsm8k_correct",
    "has_gsm8k_format",
    "int_correct",
    "parse_number",
]

# Longest numeric string we parse. Longer digit runs are not plausible answers and would make
# int() slow (and CPython refuses int(str) beyond 4300 digits by default).
MAX_NUMBER_CHARS = 200

_MINUS = "-\u2212"  # ASCII hyphen-minus, Unicode minus sign (en dash is a range, not a sign)

# One number token as written in prose: optional sign and currency, an integer part with
# either well-formed thousands groups ("1,234,567") or plain digits, optional decimals,
# optional "/denominator". The look-behind keeps digits glued to letters ("x2", "v1.5")
# and numbers continuing a previous decimal from matching.
_NUMBER_RE = re.compile(
    rf"(?<![\w.])(?:(?P<sign>[{_MINUS}])(?=[\d.$]))?(?:\$\s?)?(?P<sign2>[{_MINUS}])?"
    r"(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)"
    r"(?:/(?P<den>\d+(?:\.\d+)?))?"
)
_HASHES_RE = re.compile(r"####")
_FORMAT_RE = re.compile(rf"####\s*[{_MINUS}]?(?:\$\s?)?[{_MINUS}]?(?:\d|\.\d)")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?")


def parse_number(s: str | int | Fraction | Decimal | None) -> Fraction | None:
    """Parse one numeric string exactly into a :class:`~fractions.Fraction`.

    Args:
        s: a string such as ``"72"``, ``"-5"``, ``"$1,234.50"``, ``"10.00"``, ``"3/4"``,
            ``"25%"`` or ``"18."``; an ``int``/``Fraction``/``Decimal`` is converted as is.
            Surrounding whitespace, a leading ``$``, a trailing ``%`` (the value is kept,
            not divided by 100, matching GSM8K golds that omit the sign), a trailing ``.``
            and well-formed ``,`` thousands groups are accepted. Unicode minus is accepted.

    Returns:
        The exact value, or ``None`` when ``s`` is not a single number (words, malformed
        comma groups like ``"1,2"``, a zero denominator, more than ``MAX_NUMBER_CHARS``
        characters, ``None``). Never raises for any ``str`` input.

    Raises:
        TypeError: ``s`` is of another type (e.g. ``float``, which is inexact by nature).
    """
    if s is None:
        return None
    if isinstance(s, bool):
        raise TypeError("parse_number does not accept bool")
    if isinstance(s, (int, Fraction)):
        return Fraction(s)
    if isinstance(s, Decimal):
        return Fraction(s) if s.is_finite() else None
    if not isinstance(s, str):
        raise TypeError(f"parse_number expects str, int, Fraction or Decimal, got {type(s).__name__}")
    t = s.strip()
    if not t or len(t) > MAX_NUMBER_CHARS:
        return None
    t = t.replace("\u2212", "-")
    if t.endswith("%"):
        t = t[:-1].rstrip()
    if t.endswith(".") and not t.endswith(".."):
        t = t[:-1]
    sign = ""
    if t[:1] in "+-":
        sign, t = t[:1], t[1:].lstrip()
    if t.startswith("$"):
        t = t[1:].lstrip()
    if not sign and t[:1] in "+-":
        sign, t = t[:1], t[1:].lstrip()
    if "/" in t:
        num_s, _, den_s = t.partition("/")
        num, den = _parse_plain(num_s.strip()), _parse_plain(den_s.strip())
        if num is None or den is None or den == 0 or num_s.strip()[:1] in "+-":
            return None
        value = num / den
    else:
        value = _parse_plain(t)
        if value is None:
            return None
    return -value if sign == "-" else value


def _parse_plain(t: str) -> Fraction | None:
    """Exact value of an unsigned-or-signed decimal literal with optional thousands groups."""
    if "," in t:
        if not _THOUSANDS_RE.fullmatch(t):
            return None
        t = t.replace(",", "")
    if not _PLAIN_NUMBER_RE.fullmatch(t):
        return None
    if t.endswith("."):
        t = t[:-1]
    return Fraction(t)  # Fraction parses decimal strings exactly


def format_number(value: Fraction) -> str:
    """Canonical string of an exact number: ``"72"``, ``"-5"``, ``"1234.5"`` or ``"1/3"``.

    Args:
        value: the number.

    Returns:
        An integer string when the value is integral, a plain decimal (no trailing zeros)
        when the denominator has only factors 2 and 5, else ``"p/q"``.
    """
    if value.denominator == 1:
        return str(value.numerator)
    den = value.denominator
    twos = fives = 0
    while den % 2 == 0:
        den //= 2
        twos += 1
    while den % 5 == 0:
        den //= 5
        fives += 1
    if den == 1:
        places = max(twos, fives)
        scaled = abs(value.numerator) * (10**places // value.denominator)
        digits = str(scaled).rjust(places + 1, "0")
        text = f"{digits[:-places]}.{digits[-places:]}".rstrip("0")
        return ("-" if value < 0 else "") + text
    return f"{value.numerator}/{value.denominator}"


def _match_value(m: re.Match[str]) -> Fraction | None:
    """Value of one ``_NUMBER_RE`` match (None if the denominator is zero or too long)."""
    num_s = m.group("num")
    if len(num_s) > MAX_NUMBER_CHARS:
        return None
    value = _parse_plain(num_s)
    if value is None:
        return None
    den_s = m.group("den")
    if den_s is not None:
        den = _parse_plain(den_s) if len(den_s) <= MAX_NUMBER_CHARS else None
        if den is None or den == 0:
            return None
        value = value / den
    if m.group("sign") or m.group("sign2"):
        value = -value
    return value


def _extract_value(text: str) -> Fraction | None:
    """Number after the last ``####`` (first one there), else the last number in ``text``."""
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    last = None
    for last in _HASHES_RE.finditer(text):
        pass
    if last is not None:
        for m in _NUMBER_RE.finditer(text, last.end()):
            value = _match_value(m)
            if value is not None:
                return value
        return None
    value = None
    for m in _NUMBER_RE.finditer(text):
        v = _match_value(m)
        if v is not None:
            value = v
    return value


def extract_gsm8k_answer(text: str) -> str | None:
    """Extract the final numeric answer of a GSM8K-style completion.

    Args:
        text: model completion (or a GSM8K ``answer`` field). If it contains ``####``, the
            first number after the *last* ``####`` is used (``None`` if there is none there);
            otherwise the last number anywhere in the text. Numbers may carry a sign
            (``-``/Unicode minus), ``$``, ``,`` thousands groups, decimals, a ``/``
            denominator (``3/4``) and trailing words/units/``%``/``.``, which are dropped.

    Returns:
        The canonical numeric string (see :func:`format_number`: ``"$1,234.50"`` ->
        ``"1234.5"``, ``"10.00"`` -> ``"10"``, ``"3/4"`` -> ``"0.75"``), or ``None``.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    value = _extract_value(text)
    return None if value is None else format_number(value)


def has_gsm8k_format(completion: str) -> bool:
    """Whether the completion states its answer in GSM8K form, ``#### <number>``.

    Args:
        completion: model completion.

    Returns:
        True when some ``####`` is followed (after optional spaces, sign and ``$``) by a digit.
    """
    return isinstance(completion, str) and _FORMAT_RE.search(completion) is not None


def _gold_value(gold: str | int) -> Fraction:
    """Value of a gold answer: a bare number or a full GSM8K ``answer`` field with ``####``."""
    if isinstance(gold, int) and not isinstance(gold, bool):
        return Fraction(gold)
    if not isinstance(gold, str):
        raise TypeError(f"gold must be str or int, got {type(gold).__name__}")
    value = parse_number(gold) if "####" not in gold else None
    if value is None:
        value = _extract_value(gold)
    if value is None:
        raise ValueError(f"gold answer has no number: {gold[:80]!r}")
    return value


def gsm8k_correct(completion: str, gold: str | int) -> bool:
    """Exact numeric check of a GSM8K completion against the reference.

    Args:
        completion: model completion; its answer is found by :func:`extract_gsm8k_answer`.
        gold: the reference, either a bare number (``"72"``, ``"1,234"``) or a whole GSM8K
            ``answer`` field ending in ``#### 72``.

    Returns:
        True iff an answer was extracted and equals the gold value exactly.

    Raises:
        ValueError: the gold contains no number (a data error, not a model error).
        TypeError: wrong argument types.
    """
    gold_value = _gold_value(gold)
    value = _extract_value(completion)
    return value is not None and value == gold_value


def int_correct(completion: str, gold: str | int) -> bool:
    """Exact integer check for procedurally generated arithmetic tasks.

    Same extraction as :func:`gsm8k_correct`; the gold must be an integer. An extracted
    value counts when it is numerically that integer (``"1,000"``, ``"1000.0"`` and
    ``"2000/2"`` all equal 1000).

    Args:
        completion: model completion.
        gold: the integer answer, as ``int`` or numeric string.

    Returns:
        True iff the extracted value equals the gold integer.

    Raises:
        ValueError: the gold is not an integer.
        TypeError: wrong argument types.
    """
    gold_value = _gold_value(gold)
    if gold_value.denominator != 1:
        raise ValueError(f"int_correct needs an integer gold, got {gold!r}")
    value = _extract_value(completion)
    return value is not None and value == gold_value
