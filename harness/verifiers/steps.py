"""Safe arithmetic evaluation and per-step (process) rewards for chain-of-thought text.

``safe_eval`` is a hand-written tokenizer + recursive-descent parser over exact
:class:`~fractions.Fraction` values: model text is never passed to ``eval``/``ast``/sympy.
Only numbers (with ``,`` thousands groups, ``$``, mixed numbers ``1 1/2``), ``+ - * / ^``
(``**`` is read as ``^``), the multiplication signs ``x X × · ⋅`` and ``÷``, parentheses (with
implicit multiplication ``2(3+4)``), unary signs and a postfix ``%`` (divides by 100) are
accepted (``–``/``−`` are minus); everything else (names, ``__import__``, brackets, ``=``)
yields ``None``. Exponents must be integers and the result must stay below
``MAX_POWER_BITS`` bits, so ``9^9^9^9`` is refused instantly.

``step_rewards`` implements a simple arithmetic process reward in the spirit of GSM8K's
calculator annotations (Cobbe et al. 2021): each checkable equation in a step is recomputed.
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MAX_POWER_BITS", "safe_eval", "split_steps", "step_rewards"]

MAX_EXPR_CHARS = 500
MAX_DEPTH = 40
MAX_NUMBER_DIGITS = 60
MAX_POWER_BITS = 4096  # |exponent| * bits(base) above this -> refused
MAX_EVALS = 3000  # candidate evaluations per completion in step_rewards

_TOKEN_RE = re.compile(
    r"\s*(?:(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)|(?P<op>\*\*|[-+*/^()%]))"
)
_TRANSLATE = str.maketrans(
    {"×": "*", "·": "*", "⋅": "*", "∙": "*", "÷": "/", "−": "-", "–": "-", "$": " "}
)
# "x" is a multiplication sign only between operands: "3 x 4", "3x4", "(1+2) x $5"
_TIMES_X = re.compile(r"(?<=[\d)\s])[xX](?=\s*[\d(.$])")


class _Reject(Exception):
    """Input outside the accepted grammar or limits."""


def _tokenize(expr: str) -> list[str]:
    s = _TIMES_X.sub("*", expr).translate(_TRANSLATE).strip()
    tokens: list[str] = []
    pos = 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if not m:
            if s[pos:].strip() == "":
                break
            raise _Reject(f"unexpected character {s[pos]!r}")
        tok = m.group("num") or m.group("op")
        tokens.append("^" if tok == "**" else tok)
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.toks = tokens
        self.i = 0
        self.depth = 0

    def peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _Reject("unexpected end")
        self.i += 1
        return tok

    def expr(self) -> Fraction:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Reject("too deeply nested")
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        self.depth -= 1
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in ("*", "/", "("):
            op = self.take() if self.peek() != "(" else "*"  # implicit product: 2(3)
            rhs = self.unary()
            if op == "*":
                value = value * rhs
            else:
                if rhs == 0:
                    raise _Reject("division by zero")
                value = value / rhs
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("-", "+"):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Reject("too many signs")
            op = self.take()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if self.peek() != "^":
            return base
        self.take()
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Reject("exponent tower too deep")
        exp = self.unary()  # right-associative; allows 2^-1
        self.depth -= 1
        if exp.denominator != 1:
            raise _Reject("non-integer exponent")
        e = exp.numerator
        if base == 0 and e < 0:
            raise _Reject("division by zero")
        bits = max(base.numerator.bit_length(), base.denominator.bit_length(), 1)
        if abs(e) * bits > MAX_POWER_BITS and abs(base) != 1 and base != 0:
            raise _Reject("exponent too large")
        return base**e

    def postfix(self) -> Fraction:
        value = self.atom()
        while self.peek() == "%":
            self.take()
            value = value / 100
        return value

    def atom(self) -> Fraction:
        tok = self.take()
        if tok == "(":
            value = self.expr()
            if self.take() != ")":
                raise _Reject("unbalanced parenthesis")
            return value
        if tok[0].isdigit() or tok[0] == ".":
            value = self._number(tok)
            # mixed number "1 1/2": two numbers can only be adjacent when space-separated
            nxt = self.toks[self.i : self.i + 3]
            if (
                len(nxt) == 3
                and tok.isdigit()
                and nxt[0].isdigit()
                and nxt[1] == "/"
                and nxt[2].isdigit()
                and 0 < int(nxt[0]) < int(nxt[2])
            ):
                self.i += 3
                value += Fraction(int(nxt[0]), int(nxt[2]))
            return value
        raise _Reject(f"unexpected token {tok!r}")

    @staticmethod
    def _number(tok: str) -> Fraction:
        digits = tok.replace(",", "")
        if len(digits) > MAX_NUMBER_DIGITS:
            raise _Reject("number too long")
        return Fraction(digits)


def safe_eval(expr: str) -> Fraction | None:
    """Evaluate a plain arithmetic expression exactly, without ``eval``.

    Args:
        expr: e.g. ``"48/2"``, ``"(3 + 4) × 2"``, ``"-1.5*4"``, ``"$1,200 ÷ 4"``, ``"2^10"``,
            ``"50%"``, ``"8 x 1 1/2"``. ``x``/``X`` multiply when between operands; ``%``
            divides by 100; ``a b/c`` (integers, ``b < c``) is the mixed number a + b/c.

    Returns:
        The exact value, or ``None`` for anything outside the grammar: names or any other
        characters (``__import__('os')``), ``1,2`` (not a thousands group), division by zero,
        non-integer exponents, results above ``MAX_POWER_BITS`` bits (``9^9^9^9``), numbers
        over 60 digits, nesting over 40 levels, inputs over 500 characters, empty input.
        Never raises for ``str`` input.

    Raises:
        TypeError: ``expr`` is not a ``str``.
    """
    if not isinstance(expr, str):
        raise TypeError(f"expected str, got {type(expr).__name__}")
    if not expr.strip() or len(expr) > MAX_EXPR_CHARS:
        return None
    try:
        parser = _Parser(_tokenize(expr))
        value = parser.expr()
        if parser.peek() is not None:
            return None
        return value
    except (_Reject, ZeroDivisionError, ValueError, OverflowError, RecursionError):
        return None


# ---------------------------------------------------------------------------------------
# Steps

_ANNOT_RE = re.compile(r"<<([^<>]{1,300})>>")
_EQ_SPLIT_RE = re.compile(r"(?<![<>!=])=(?!=)")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\d$])")
_MATH_CHARS = r"0-9.,+\-*/^()%$\sxX×÷·⋅∙−–"
_TRAIL_RE = re.compile(rf"[{_MATH_CHARS}]{{1,200}}$")
_LEAD_RE = re.compile(rf"^[{_MATH_CHARS}]{{1,200}}")
_OPS = "+-*/^×÷·⋅∙−–"
_CONNECTIVE_RE = re.compile(
    r"(?:\b(?:of|times|plus|minus|by|over|divided|multiplied|x|X)|[" + re.escape(_OPS) + r"(])\s*$"
)
_LAST_NUMBER_RE = re.compile(r"(\d[\d,]*)(?:\.(\d+))?\s*(%?)\s*$")


def split_steps(completion: str) -> list[tuple[int, int]]:
    """Split a completion into reasoning steps: lines, then sentences within a line.

    Args:
        completion: model completion.

    Returns:
        ``(start, end)`` character spans (end exclusive, trailing whitespace excluded) of the
        non-empty steps, in order. A sentence ends at ``.``/``!``/``?`` followed by space and
        an upper-case letter, digit, ``$`` or ``(``; ``<<...>>`` annotations are not split.
    """
    spans = []
    for m in re.finditer(r"[^\n]+", completion):
        line, base = m.group(0), m.start()
        protected = _ANNOT_RE.sub(lambda a: "#" * len(a.group(0)), line)
        start = 0
        for cut in _SENTENCE_END_RE.finditer(protected):
            spans.append((base + start, base + cut.start()))
            start = cut.end()
        spans.append((base + start, base + len(line)))
    out = []
    for s, e in spans:
        seg = completion[s:e]
        if seg.strip():
            lead = len(seg) - len(seg.lstrip())
            out.append((s + lead, s + len(seg.rstrip())))
    return out


class _Budget:
    """Caps the number of candidate evaluations per completion (keeps worst cases ~0.2 s)."""

    def __init__(self, evals: int) -> None:
        self.left = evals

    def eval(self, expr: str) -> Fraction | None:
        if self.left <= 0:
            return None
        self.left -= 1
        return safe_eval(expr)


def _trailing_expr(text: str, budget: _Budget) -> tuple[str, Fraction] | None:
    """Longest arithmetic expression ending ``text`` that is not cut out of a larger one."""
    t = text.rstrip()
    m = _TRAIL_RE.search(t)
    if not m or t[-1] in _OPS + "(":
        return None  # every candidate would end in an operator
    for k in range(m.start(), len(t)):
        c = t[k]
        if not (c.isdigit() or c in "(.$-−–"):
            continue
        prev = t[k - 1] if k > 0 else " "
        if prev.isalnum() and prev not in "xX" or prev in ".,":
            continue
        value = budget.eval(t[k:])
        if value is None:
            continue
        before = t[:k]
        if _CONNECTIVE_RE.search(before) or before.rstrip()[-1:].isdigit():
            return None  # the expression continues to the left in words/operators
        return t[k:].strip(), value
    return None


def _leading_expr(text: str, budget: _Budget) -> tuple[str, Fraction] | None:
    """Longest arithmetic expression starting ``text`` that is not cut out of a larger one."""
    t = text.lstrip()
    m = _LEAD_RE.match(t)
    if not m:
        return None
    for k in range(m.end(), 0, -1):
        cand = t[:k]
        nxt = t[k] if k < len(t) else " "
        if nxt.isdigit() or (nxt in ".," and k + 1 < len(t) and t[k + 1].isdigit()):
            continue
        value = budget.eval(cand)
        if value is None:
            continue
        rest = t[k:].lstrip()
        if rest[:1] and (rest[0] in _OPS + "(" or (rest[0] in "xX" and not rest[1:2].isalpha())):
            return None  # cut out of a longer (e.g. algebraic) expression
        if nxt.isalpha() and nxt not in "xX" and cand[-1:].isdigit():
            return None  # "5x" style: a number glued to a variable
        return cand.strip(), value
    return None


def _has_operator(expr: str) -> bool:
    return bool(re.search(r"(?<=[\d)%\s])[-+*/^×÷·⋅∙−–xX]", expr.strip()))


def _matches(lhs: Fraction, rhs_text: str, rhs: Fraction) -> bool:
    """lhs equals rhs exactly, or rhs is lhs rounded to rhs's decimals, or a percent reading."""
    if lhs == rhs:
        return True
    m = _LAST_NUMBER_RE.search(rhs_text)
    if not m or _has_operator(rhs_text):
        return False
    if m.group(3) and lhs == rhs * 100:  # "1/4*100 = 25%"
        return True
    places = len(m.group(2) or "")
    if places:
        return abs(lhs - rhs) <= Fraction(1, 2 * 10**places)
    return False


def _equation_checks(text: str, budget: _Budget) -> list[bool]:
    checks = []
    for m in _ANNOT_RE.finditer(text):
        parts = _EQ_SPLIT_RE.split(m.group(1))
        if len(parts) == 2:
            lhs, rhs = budget.eval(parts[0]), budget.eval(parts[1])
            if lhs is not None and rhs is not None:
                checks.append(_matches(lhs, parts[1], rhs))
    plain = _ANNOT_RE.sub(" ", text)
    parts = _EQ_SPLIT_RE.split(plain)
    for i in range(len(parts) - 1):
        left, right = parts[i], parts[i + 1]
        whole = budget.eval(left) if i > 0 and len(left) <= MAX_EXPR_CHARS else None
        if whole is not None:  # middle of a chain "a = b = c": b is entirely an expression
            lhs_text, lhs = left.strip(), whole
        else:
            found = _trailing_expr(left, budget)
            if found is None or not _has_operator(found[0]):
                continue  # "x = 5", "20% of 50 = 10", ...: not a checkable computation
            lhs_text, lhs = found
        found_r = _leading_expr(right, budget)
        if found_r is None:
            continue
        checks.append(_matches(lhs, found_r[0], found_r[1]))
    return checks


def step_rewards(completion: str) -> list[tuple[int, float]]:
    """Arithmetic process rewards: one ``(end_offset, reward)`` per checkable step.

    Steps come from :func:`split_steps`. In each step every GSM8K calculator annotation
    ``<<expr=result>>`` and every plain equation ``lhs = rhs`` (chains ``a = b = c`` give one
    check per ``=``) is recomputed with :func:`safe_eval`: ``lhs`` is the longest arithmetic
    expression before ``=`` and must contain an operator; ``rhs`` is the arithmetic expression
    right after ``=`` (usually the number, e.g. ``$24`` in ``= $24 each``). ``rhs`` matches when
    equal, when it is ``lhs`` rounded to ``rhs``'s decimal places (``10/3 = 3.33``), or for
    ``... = 25%`` when ``lhs`` is 25. Equations that cannot be isolated (variables, words
    such as ``of`` right before the lhs, a number glued to a letter) are ignored. At most
    ``MAX_EVALS`` candidate sub-expressions are evaluated per completion (adversarial text
    cannot stall the trainer); equations after that budget is spent are ignored.

    Args:
        completion: model completion.

    Returns:
        ``(end, reward)`` for each step with at least one check, in order: ``end`` is the
        character offset just past the step in ``completion``; ``reward`` is 1.0 if all
        checks pass, else 0.0. Steps without a checkable equation are omitted (no process
        signal), so the list may be empty. The trainer maps offsets to tokens and adds the
        outcome reward to the final step.

    Raises:
        TypeError: ``completion`` is not a ``str``.
    """
    if not isinstance(completion, str):
        raise TypeError(f"expected str, got {type(completion).__name__}")
    out = []
    budget = _Budget(MAX_EVALS)
    for start, end in split_steps(completion):
        checks = _equation_checks(completion[start:end], budget)
        if checks:
            out.append((end, 1.0 if all(checks) else 0.0))
    return out
