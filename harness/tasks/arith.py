"""Procedurally generated arithmetic word problems: a small task where learning is visible on CPU.

Each problem is a chain of ``num_ops`` operations on ``digits``-digit operands, told as a
short story, optionally padded with ``distractors`` sentences holding irrelevant numbers.
Problem ``i`` of the train stream is a pure function of ``(seed, i)``, so the stream is
unbounded, reproducible and resumable; the test set is ``test_size`` problems from a
separate seed namespace. The verifier is an exact integer match.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional

from harness.tasks.base import TASKS, Problem, Shot, Task, TaskConfig
from harness.tools.formats import hermes_call

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena"]
ITEMS = ["apples", "stickers", "marbles", "books", "coins", "pencils", "cards", "shells", "stamps"]
OTHER = ["cats", "chairs", "windows", "cousins", "songs", "plants"]

OPERATORS = {
    "+": ("{name} gets {b} more {item}.", lambda a, b: a + b),
    "-": ("{name} gives away {b} {item}.", lambda a, b: a - b),
    "*": ("Then the number of {item} {name} has becomes {b} times as large.", lambda a, b: a * b),
}
_SYMBOL = {"+": "+", "-": "-", "*": "*"}


def make_problem(rng: random.Random, digits: int, num_ops: int, operators: list, distractors: int):
    """One problem: (question text, integer answer, list of worked steps).

    Raises:
        ValueError: an operator outside ``+ - *``, digits < 1 or num_ops < 1.
    """
    bad = [op for op in operators if op not in OPERATORS]
    if bad or not operators:
        raise ValueError(f"task.operators={operators}: expected a non-empty list from {sorted(OPERATORS)}")
    if digits < 1 or num_ops < 1:
        raise ValueError(f"task.digits={digits}, task.num_ops={num_ops}: both must be >= 1")
    lo, hi = 10 ** (digits - 1), 10**digits - 1
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(lo, hi)
    sentences = [f"{name} has {value} {item}."]
    steps = []
    for _ in range(num_ops):
        op = rng.choice(operators)
        b = rng.randint(2, 9) if op == "*" else rng.randint(lo, hi)
        if op == "-" and b > value:  # keep counts non-negative
            op = "+"
        template, fn = OPERATORS[op]
        new = fn(value, b)
        sentences.append(template.format(name=name, b=b, item=item))
        steps.append(f"{value} {_SYMBOL[op]} {b} = {new}")
        value = new
    for _ in range(distractors):
        pos = rng.randint(1, len(sentences))
        sentences.insert(pos, f"{rng.choice(NAMES)} has {rng.randint(lo, hi)} {rng.choice(OTHER)}.")
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    return question, value, steps


def worked_answer(steps: list[str], answer: int, tool=None) -> str:
    """The answer style the prompt asks for: one equation per line, then ``#### N``.

    With ``tool`` (a :class:`harness.tools.ToolRunner`), each step's right-hand side is the
    tool's call and its observation, as an episode rollout produces them:
    ``1234 + 5678 = <calc>1234 + 5678</calc><result>6912</result>``.
    """
    if tool is not None:
        p = tool.params
        steps = [f"{lhs} = {p.call_open}{lhs}{p.call_close}{tool.wrap(tool.observe(lhs))}"
                 for lhs in (s.split(" = ")[0] for s in steps)]
    return "\n".join(steps) + f"\n#### {answer}"


def chat_turns(steps: list[str], answer: int, tool) -> tuple:
    """A worked example as chat turns (``tools.format=chat_template``): per step an assistant turn
    with one hermes call of its left-hand side (:func:`harness.tools.formats.hermes_call`) and the
    tool message with the observation, then the assistant's answer (:func:`worked_answer`)."""
    turns = []
    for lhs in (s.split(" = ")[0] for s in steps):
        turns.append({"role": "assistant", "content": hermes_call(tool.schema(), lhs)})
        turns.append({"role": "tool", "name": tool.params.name, "content": tool.observe(lhs).text})
    return (*turns, {"role": "assistant", "content": worked_answer(steps, answer)})


@dataclass
class ArithTaskConfig(TaskConfig):
    """Procedurally generated arithmetic word problems (no data files needed)."""

    name: str = "arith"
    eval_size: Optional[int] = 100
    instruction: str = ("Solve the problem. Show the calculation, then end with a line of the form "
                        "'#### <number>'.\n\n{question}")
    digits: int = 2  # operand digits
    num_ops: int = 1  # operations per problem
    operators: list = field(default_factory=lambda: ["+", "-"])
    distractors: int = 0  # irrelevant sentences with numbers
    test_size: int = 200  # problems in the fixed test set (eval_size are drawn from it)
    seed: int = 0


@TASKS.register("arith", params=ArithTaskConfig)
class ArithTask(Task):
    """Arithmetic word problems (``task=arith``); see the module docstring for the knobs."""

    name = "arith"
    verifier_kind = "int"

    def __init__(self, cfg):
        super().__init__(cfg)
        self._gen_args = (cfg.digits, cfg.num_ops, list(cfg.operators), cfg.distractors)
        self.use_tool(None)
        test = [self._make("test", i) for i in range(cfg.test_size)]
        self.record_source("train", "generated:arith (seeded stream; the code is git.commit)")
        self.record_source("test", "generated:arith")
        self.eval = self.pick_eval(test)
        self.train = ()

    def use_tool(self, tool) -> None:
        """The worked examples (their own seed namespace), showing ``tool``'s calls when given: in
        its tags (:func:`worked_answer`), or under ``tools.format=chat_template`` as chat turns
        (:func:`chat_turns`)."""
        super().use_tool(tool)
        chat = self.tool_schemas is not None
        self.shots = tuple(
            Shot(q, worked_answer(steps, a, None if chat else tool), chat_turns(steps, a, tool) if chat else ())
            for q, a, steps in (
                make_problem(random.Random(f"shot-{self.cfg.seed}-{i}"), *self._gen_args) for i in range(4)
            )
        )

    def _make(self, split: str, index: int) -> Problem:
        rng = random.Random(f"{split}-{self.cfg.seed}-{index}")
        q, a, steps = make_problem(rng, *self._gen_args)
        return Problem(f"{split}/{index}", q, str(a), {"steps": steps})

    def train_problem(self, index: int, seed: int) -> Problem:
        """Problem ``index`` of the unbounded stream (depends on ``task.seed`` and run ``seed``);
        with ``task.train_size=N`` the stream cycles over its first N problems."""
        if self.cfg.train_size:
            index %= self.cfg.train_size
        return self._make(f"train{seed}", index)
