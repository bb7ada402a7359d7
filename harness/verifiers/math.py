"""Answer verifier for MATH / MATH-500 style problems (final answer in ``\\boxed{...}``).

Conventions:

* Answer extraction follows the MATH release (Hendrycks et al. 2021, arXiv:2103.03874): the
  final answer is the content of the *last* ``\\boxed{...}`` or ``\\fbox{...}``, found with a
  brace-balanced scan; the brace-less form ``\\boxed 5`` runs up to whitespace or ``$``.
* Equivalence is decided by ``math_verify`` (Hugging Face, MIT licence), gold first
  (``verify`` is asymmetric), with both answers wrapped as ``$\\boxed{...}$`` so its LaTeX
  extractor finds them. Only ``LatexExtractionConfig`` is used: ``ExprExtractionConfig`` would
  hand plain model text to ``sympy.parse_expr`` (which uses ``eval``), so it is never enabled.
* The result is OR-ed with an exact comparison of both answers after a string normaliser
  written for this project in the spirit of the MATH ``is_equiv`` conventions (drop
  ``\\left``/``\\right``, spacing commands, ``\\text{}`` units, degrees, ``\\$``, ``\\%``,
  ``x=`` prefixes; repair ``\\frac12`` and ``\\sqrt2``; canonicalise plain numbers). This
  covers answers that math_verify cannot parse (e.g. ``10\\%``) and identical strings.
* Thousands separators: an answer that is *entirely* a number with well-formed 3-digit
  groups (``1,000``, ``12,345.6``, also ``1{,}000`` / ``1,\\!000``) is read as that number.
  Anything else with commas (``1,2`` or ``10,20``) is a list/tuple. math_verify already reads
  ``1,000`` as 1000; the normaliser does the same so both paths agree.

:func:`answers_equivalent` has no time bound of its own (sympy can run for ever on inputs like
``9^{9^{9^9}}``); it is meant to run inside the worker processes of
:mod:`harness.verifiers.batch`, which enforce a deadline by killing the worker.
:func:`harness.verifiers.batch.math_correct` goes through that pool and is therefore bounded from any
thread.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

__all__ = [
    "answers_equivalent",
    "extract_boxed",
    "has_boxed",
    "normalize_answer",
    "ungroup_thousands",
]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_MAX_ANSWER_CHARS = 2000  # answers longer than this are not compared (they are not answers)


def _box_at(text: str, start: int, cmd: str) -> str | None:
    """Content of the box command ``cmd`` found at ``text[start]``, or None if malformed."""
    i = start + len(cmd)
    if i < len(text) and (text[i].isalpha()):
        return None  # e.g. \boxedfoo is another command
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        for k in range(j, len(text)):
            c = text[k]
            if c == "{" and text[k - 1] != "\\":
                depth += 1
            elif c == "}" and text[k - 1] != "\\":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : k]
        return None  # unbalanced: truncated completion
    if j > i:  # "\boxed 5": up to whitespace or "$"
        m = re.match(r"[^\s$]+", text[j:])
        return m.group(0) if m else None
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Args:
        text: a completion or solution. Braces are matched with a balanced scan (escaped
            ``\\{``/``\\}`` do not count); ``\\boxed 5`` (no braces) runs to whitespace/``$``.

    Returns:
        The box content with surrounding whitespace stripped (may be ``""`` for an empty
        box), or ``None`` when there is no box or the last box is unbalanced/truncated.
        Source of the convention: the MATH dataset's ``last_boxed_only_string``.

    Raises:
        TypeError: ``text`` is not a ``str``.
    """
    if not isinstance(text, str):
        raise TypeError(f"expected str, got {type(text).__name__}")
    best, best_cmd = -1, ""
    for cmd in _BOX_COMMANDS:
        pos = text.rfind(cmd)
        # skip occurrences that are prefixes of longer commands (\boxedfoo)
        while pos != -1 and pos + len(cmd) < len(text) and text[pos + len(cmd)].isalpha():
            pos = text.rfind(cmd, 0, pos)
        if pos > best:
            best, best_cmd = pos, cmd
    if best < 0:
        return None
    content = _box_at(text, best, best_cmd)
    return None if content is None else content.strip()


def has_boxed(completion: str) -> bool:
    """Whether the completion ends its answer in a well-formed, non-empty box.

    Args:
        completion: model completion.

    Returns:
        True iff :func:`extract_boxed` finds a non-empty answer.
    """
    if not isinstance(completion, str):
        return False
    content = extract_boxed(completion)
    return bool(content)


# ---------------------------------------------------------------------------------------
# String normaliser (fallback path)

_TEXT_CMDS = r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)"
_TRAILING_UNITS = re.compile(
    r"(.*?[\d}])\s*(?:\\[,;! ])*\s*" + _TEXT_CMDS + r"\s*\{\s*[A-Za-z][A-Za-z .^0-9]*\}(\^\{?\d\}?)?"
)
_SPACING = re.compile(r"(?<!\\)\\[!,;: ]|\\q?quad|~")
# a whole answer that is one number with 3-digit groups: 1,000 / 1{,}000 / 1,\!000 / 2\,000 / 2 000
_GROUPED = re.compile(r"-?\d{1,3}(?:(?:,(?:\\!\s?)?|\{,\}|\\[,!;: ]\s?| )\d{3})+(?:\.\d+)?")
_ASSIGNMENT = re.compile(r"[A-Za-z](?:_\{?\w\}?)?\s*=\s*(.+)")
_REPEATING = re.compile(r"(-?)(\d*)\.(\d*)\\overline\{(\d{1,20})\}")
_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
_FRAC_NUM = re.compile(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}")
_SLASH_NUM = re.compile(r"(-?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)")


def _unwrap_text(s: str) -> str:
    """Replace ``\\text{abc}`` (and similar) by ``abc``; brace-balanced, non-nested content."""
    return re.sub(_TEXT_CMDS + r"\s*\{([^{}]*)\}", r"\1", s)


def _remove_trailing_units(s: str) -> str:
    """Drop a trailing ``\\text{ units}`` / ``\\mbox{units}`` after a numeric-looking answer."""
    m = _TRAILING_UNITS.fullmatch(s)
    return m.group(1) if m else s


def ungroup_thousands(answer: str) -> str:
    """Digits only if the whole answer is one number with 3-digit groups, else unchanged.

    Args:
        answer: e.g. ``"1,000"``, ``"10,\\!080"``, ``"1{,}000"``, ``"2\\,000"``, ``"2 000"``.

    Returns:
        ``"1000"`` etc.; anything else (``"1,2"``, ``"100, 200"``, ``"(1,000)"``) unchanged.
        Convention of this project: a comma followed by exactly three digits inside a lone
        number is a thousands separator, never a list (math_verify reads ``1,000`` the same
        way; without this, it reads ``2\\,000`` as the product ``2*000``).
    """
    t = answer.strip()
    if _GROUPED.fullmatch(t):
        return re.sub(r"[^\d.\-]", "", t)
    return answer


def _repeating_value(m: re.Match[str]) -> Fraction:
    """Exact value of ``a.b\\overline{c}``."""
    sign, whole, nonrep, rep = m.groups()
    value = Fraction(int(whole or "0"))
    value += Fraction(int(nonrep + rep) - int(nonrep or "0"), 10 ** len(nonrep) * (10 ** len(rep) - 1))
    return -value if sign else value


def _canonical_number(s: str) -> str | None:
    """Canonical text of a pure rational literal: ``0.50``, ``\\frac{1}{2}``, ``1/2``, ``0.\\overline{3}``."""
    value: Fraction | None = None
    rep = _REPEATING.fullmatch(s) if len(s) <= 100 else None
    if rep:
        value = _repeating_value(rep)
    elif _NUMBER.fullmatch(s) and len(s) <= 100:
        value = Fraction(s.rstrip(".") if s.endswith(".") else s)
    else:
        m = _FRAC_NUM.fullmatch(s) or _SLASH_NUM.fullmatch(s)
        if m and len(s) <= 100:
            groups = m.groups()
            sign = groups[0] if len(groups) == 3 else ""
            num, den = Fraction(groups[-2]), Fraction(groups[-1])
            if den == 0:
                return None
            value = num / den * (-1 if sign == "-" else 1)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _fix_frac_and_sqrt(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``."""
    s = re.sub(r"\\sqrt\s*([0-9A-Za-z])", r"\\sqrt{\1}", s)
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*([0-9A-Za-z])", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*([0-9A-Za-z])\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*(\{[^{}]*\})\s*([0-9A-Za-z])", r"\\frac\1{\2}", s)
    return s


def normalize_answer(answer: str, *, strip_assignment: bool = True) -> str:
    """Normalise a final-answer string for exact string comparison.

    Written for this project after the MATH evaluation conventions (Hendrycks et al. 2021,
    ``is_equiv``/``strip_string``): removes ``\\left``/``\\right``, spacing commands and
    spaces, ``\\text{}``-style wrappers and trailing units, degrees (``^\\circ``), ``\\$``,
    ``\\%``, a short ``x=`` prefix and a trailing ``.``; maps ``\\dfrac``/``\\tfrac`` to
    ``\\frac``; repairs ``\\frac12``/``\\sqrt2``; strips a nested ``\\boxed{}``; rewrites pure
    rational literals canonically (``0.5``, ``.5``, ``1/2``, ``\\frac{1}{2}`` -> ``1/2``,
    ``0.\\overline{3}`` -> ``1/3``); removes thousands separators (:func:`ungroup_thousands`);
    a lone letter choice ``(B)`` -> ``B``.

    Args:
        answer: the answer text (box content, not the whole completion).
        strip_assignment: drop a one-letter ``x=`` / ``x_1=`` prefix (MATH convention).

    Returns:
        The normalised string (possibly empty). Pure string manipulation; never evaluates.

    Raises:
        TypeError: ``answer`` is not a ``str``.
    """
    if not isinstance(answer, str):
        raise TypeError(f"expected str, got {type(answer).__name__}")
    s = answer.strip()
    inner = extract_boxed(s) if "\\boxed" in s or "\\fbox" in s else None
    if inner is not None and s.startswith(("\\boxed", "\\fbox")):
        s = inner
    s = s.replace("\n", " ").replace("\\left", "").replace("\\right", "")
    s = s.replace("\\displaystyle", "").replace("\\$", "").replace("$", "")
    s = ungroup_thousands(s.replace("{,}", ","))
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = _SPACING.sub(" ", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?|\u00b0|\\degree", "", s)
    s = _remove_trailing_units(s.strip())
    s = _unwrap_text(s)
    s = s.replace("\\%", "").replace("%", "")
    s = ungroup_thousands(s.strip().rstrip(".").strip())
    m = _ASSIGNMENT.fullmatch(s)
    if strip_assignment and m and "=" not in m.group(1):
        s = m.group(1)
    s = _fix_frac_and_sqrt(s)
    s = s.replace(" ", "")
    m = re.fullmatch(r"\(([A-Za-z])\)", s)
    if m:
        s = m.group(1)
    if s.startswith("."):
        s = "0" + s
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)
    canonical = _canonical_number(s)
    return canonical if canonical is not None else s


# ---------------------------------------------------------------------------------------
# Equivalence

_TOWER = re.compile(r"\d+(?:\s*\^\s*\{?\s*\d+)+\s*\}*\s*!?|\d+\s*!")
_BIG = 10**7  # exponents / factorial arguments beyond this are never evaluated


def _explosive(answer: str) -> bool:
    """True for integer power towers / factorials too large to evaluate (``9^{9^{9^9}}``).

    A cheap pre-screen so such answers do not occupy a worker until its deadline; the
    deadline stays the actual guarantee. Symbolic exponents (``2^{n^2}``) are not affected.
    """
    for m in _TOWER.finditer(answer):
        nums = [int(x) for x in re.findall(r"\d+", m.group(0)[:200])]
        value: int | None = nums[-1]  # None = "huge"
        for base in reversed(nums[:-1]):
            if base <= 1:
                value = base
            elif value is None or value > _BIG:
                return True
            elif value * (base.bit_length() - 1) <= 64:  # result below 2^(64 + value)
                value = base**value
            else:
                value = None
        if m.group(0).rstrip().endswith("!") and (value is None or value > 10**5):
            return True
    return False


def _mv_parse(answer: str) -> list:
    """math_verify parse of one answer wrapped as ``$\\boxed{...}$`` (no internal timeout)."""
    from math_verify import LatexExtractionConfig, parse  # lazy: sympy; only the verifier workers load it

    wrapped = "$\\boxed{" + answer.replace("\n", " ") + "}$"
    return parse(
        wrapped,
        extraction_config=[LatexExtractionConfig()],
        parsing_timeout=None,  # type: ignore[arg-type]  # bounded from outside (worker kill)
        raise_on_error=False,
    )


def answers_equivalent(pred: str, gold: str) -> bool:
    """Decide whether a predicted final answer equals the gold answer (unbounded time).

    Args:
        pred: the predicted answer text (box content, not the whole completion).
        gold: the gold answer (MATH ``answer`` field; a full solution is reduced to its box).

    Returns:
        ``verify(parse(gold), parse(pred))`` from math_verify (gold first, both wrapped in
        ``$\\boxed{}$``, LaTeX extraction only), OR equality of :func:`normalize_answer` of
        both. Empty or over-long (> 2000 chars) predictions are False, and so are integer
        power towers / factorials too large to evaluate (``9^{9^{9^9}}``) unless they match
        the gold as strings.

    Raises:
        TypeError: non-string arguments. math_verify errors are swallowed by math_verify
        itself (``raise_on_error=False``). No time bound: call it under an external deadline
        (``verify_batch`` does).
    """
    if not isinstance(pred, str) or not isinstance(gold, str):
        raise TypeError("pred and gold must be str")
    if "\\boxed" in gold or "\\fbox" in gold:
        gold = extract_boxed(gold) or gold
    pred, gold = pred.strip(), gold.strip()
    if not pred or len(pred) > _MAX_ANSWER_CHARS:
        return False
    # "y=5" vs "x=5": only strip an assignment prefix when one side lacks it
    both_assign = bool(_ASSIGNMENT.fullmatch(pred) and _ASSIGNMENT.fullmatch(gold))
    if normalize_answer(pred, strip_assignment=not both_assign) == normalize_answer(
        gold, strip_assignment=not both_assign
    ):
        return True
    if _explosive(pred) or _explosive(gold):
        return False  # not equal as strings (checked above) and too large to evaluate
    from math_verify import verify  # lazy: sympy; only the verifier workers load it

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    gold_parsed = _mv_parse(ungroup_thousands(gold))
    pred_parsed = _mv_parse(ungroup_thousands(pred))
    if not gold_parsed or not pred_parsed:
        return False
    return bool(
        verify(
            gold_parsed,
            pred_parsed,
            allow_set_relation_comp=True,  # "x > 2" matches "(2, \infty)"
            timeout_seconds=None,  # type: ignore[arg-type]
            raise_on_error=False,
        )
    )
