"""``tools=calculator``: exact arithmetic with the verifiers' safe parser (never ``eval``)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.tools.base import TOOLS, ToolConfig, ToolError
from harness.verifiers.numeric import format_number
from harness.verifiers.steps import safe_eval


@dataclass
class CalculatorConfig(ToolConfig):
    """``tools=calculator``: ``<calc>12*7</calc>`` -> ``<result>84</result>``.

    The expression grammar and its bounds are :func:`harness.verifiers.steps.safe_eval`'s
    (``+ - * / ^ ( ) %``; at most 500 characters, 40 levels, 60-digit numbers, results of at most
    4096 bits, so ``9**9**9**9`` is refused at once); ``max_digits`` bounds the printed result.
    """

    name: str = "calculator"
    max_digits: int = 60  # results longer than this (digits of the printed value) are refused


@TOOLS.register("calculator", params=CalculatorConfig)
class Calculator:
    """Evaluates one arithmetic expression exactly (:func:`harness.verifiers.steps.safe_eval`).

    ``**`` is read as ``^`` (power). Integers print as integers, other rationals as decimals
    (:func:`harness.verifiers.numeric.format_number`).

    Raises (on call):
        ToolError: an expression outside the grammar or its bounds, or a result longer than
            ``max_digits`` digits.
    """

    def __init__(self, params: CalculatorConfig):
        self.params = params

    def schema(self) -> dict:
        """The function schema shown to a chat template (``tools.format=chat_template``): one string argument."""
        return {"type": "function", "function": {
            "name": self.params.name,
            "description": "Evaluate an arithmetic expression exactly (+ - * / ^ and parentheses).",
            "parameters": {"type": "object", "required": ["expression"], "properties": {
                "expression": {"type": "string", "description": "the expression, e.g. 12*7"}}}}}

    def __call__(self, expr: str) -> str:
        value = safe_eval(expr.replace("**", "^"))
        if value is None:
            raise ToolError("not a bounded arithmetic expression")
        text = format_number(value)
        if sum(c.isdigit() for c in text) > self.params.max_digits:
            raise ToolError(f"result longer than {self.params.max_digits} digits")
        return text
