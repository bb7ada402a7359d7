"""Reward verifiers: GSM8K/integer numeric answers, MATH boxed answers, arithmetic steps.

Public API (see each module for conventions and sources):

* :mod:`.numeric` - ``extract_gsm8k_answer``, ``parse_number``, ``gsm8k_correct``,
  ``has_gsm8k_format``, ``int_correct``
* :mod:`.math` - ``extract_boxed``, ``has_boxed``, ``normalize_answer``,
  ``answers_equivalent`` (unbounded, for workers)
* :mod:`.steps` - ``safe_eval``, ``split_steps``, ``step_rewards``
* :mod:`.batch` - ``Verdict``, ``verify_batch``, ``math_correct`` (one answer, bounded),
  ``summarize``, ``shutdown_pool``, ``VERIFIERS`` (the registry of verifier kinds)

Nothing in this package imports torch; math_verify/sympy are imported lazily (in the
worker processes for ``verify_batch("math", ...)``).
"""

from harness.verifiers.batch import VERIFIERS, Verdict, math_correct, shutdown_pool, summarize, verify_batch
from harness.verifiers.math import (
    answers_equivalent,
    extract_boxed,
    has_boxed,
    normalize_answer,
)
from harness.verifiers.numeric import (
    extract_gsm8k_answer,
    format_number,
    gsm8k_correct,
    has_gsm8k_format,
    int_correct,
    parse_number,
)
from harness.verifiers.steps import safe_eval, split_steps, step_rewards

__all__ = [
    "VERIFIERS",
    "Verdict",
    "answers_equivalent",
    "extract_boxed",
    "extract_gsm8k_answer",
    "format_number",
    "gsm8k_correct",
    "has_boxed",
    "has_gsm8k_format",
    "int_correct",
    "math_correct",
    "normalize_answer",
    "parse_number",
    "safe_eval",
    "shutdown_pool",
    "split_steps",
    "step_rewards",
    "summarize",
    "verify_batch",
]
