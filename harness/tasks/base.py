"""The task interface: data + prompt + verifier, one module per task.

A task owns its problems (train stream and fixed eval set), turns a problem into a chat
prompt, and scores completions with a verifier kind from :mod:`harness.verifiers`. The trainer
only sees :class:`Task`. Adding a task is one module in this package and one test: the module
declares its params (a :class:`TaskConfig` subclass, the ``task=<name>`` config node) and
registers its class with them in :data:`TASKS`; docs/contributing.md shows one.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from omegaconf import MISSING

from harness.runtime.provenance import file_sha256
from harness.registry import Registry
from harness.tasks.data import DataError
from harness.verifiers import Verdict, parse_number, step_rewards, verify_batch

log = logging.getLogger(__name__)

# name -> Task subclass, with its TaskConfig subclass as params; ``task=<name>`` picks one
TASKS: Registry = Registry("task")


@dataclass
class TaskConfig:
    """Fields every task has. ``eval_size`` problems are drawn once with ``eval_seed``."""

    name: str = MISSING
    eval_size: Optional[int] = 50  # None = the whole test set; more than the test set holds is refused
    eval_seed: int = 1234
    train_size: Optional[int] = None  # cap on training problems (None = all): the stream cycles over them
    num_shots: int = 2  # worked examples prepended as chat turns (0 = zero-shot)
    system_prompt: Optional[str] = None
    instruction: str = "{question}"
    format_reward: float = 0.0  # weight of the answer-format reward component


@dataclass(frozen=True)
class Problem:
    """One problem. ``gold`` is the final answer string the verifier compares against."""

    id: str
    question: str
    gold: str
    meta: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Shot:
    """A worked example shown to the model as a user/assistant turn before the question.

    ``turns``: when not empty, the messages shown after the question instead of one assistant
    message with ``answer`` (a worked example with tool calls under ``tools.format=chat_template``:
    assistant calls, tool messages, the final answer).
    """

    question: str
    answer: str
    turns: tuple = ()


class Task:
    """Base class. Subclasses set ``verifier_kind`` (a name in
    :data:`harness.verifiers.VERIFIERS`) and fill ``train``/``eval`` problem lists.

    Args:
        cfg: the task's config node (``cfg.task``: its registered :class:`TaskConfig` subclass).
    """

    name: str = "base"
    verifier_kind: str = "gsm8k"
    shots: Sequence[Shot] = ()
    tool_schemas: Optional[list] = None  # tools=... tools.format=chat_template: the prompt's tools=[schema]

    def __init__(self, cfg):
        self.cfg = cfg
        self.train: Sequence[Problem] = []
        self.eval: list[Problem] = []
        self.skipped_rows = 0  # malformed rows skipped while loading (logged by the trainer)
        self.unparseable_golds = 0  # numeric golds that do not parse (those problems can never score 1)
        # split -> {"source": file path / "hub:<id>" / "generated:<task>", "sha256": file or dataset digest}
        self.sources: dict[str, dict] = {}

    def record_source(self, split: str, source, digest: str = "") -> None:
        """Note where ``split`` came from (provenance): a path (hashed here) or a hub/generator name."""
        if isinstance(source, Path):
            self.sources[split] = {"source": str(source), "sha256": file_sha256(source)}
        else:
            self.sources[split] = {"source": str(source), "sha256": digest}

    # ----------------------------------------------------------------- data order
    def train_problem(self, index: int, seed: int) -> Problem:
        """The ``index``-th training problem of an endless seeded stream.

        Epoch ``e = index // N`` visits all N problems in a permutation seeded by
        ``(seed, e)``, so the order is reproducible and resumable from ``index`` alone.
        """
        n = len(self.train)
        if n == 0:
            raise ValueError(f"task {self.name!r} has no training problems")
        epoch, pos = divmod(index, n)
        order = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
        return self.train[order[pos]]

    def pick_eval(self, problems: Sequence[Problem]) -> list[Problem]:
        """A fixed subset of ``cfg.eval_size`` problems drawn with ``cfg.eval_seed``.

        Raises:
            DataError: ``task.eval_size`` asks for more problems than the test set holds (the eval
                set would silently be smaller than the knob says).
        """
        size = self.cfg.eval_size
        if size is not None and size > len(problems):
            raise DataError(f"task.eval_size={size}: the {self.cfg.name} test set has only {len(problems)} problems "
                            f"(after its filters); expected task.eval_size <= {len(problems)}"
                            + (" or a larger task.test_size" if hasattr(self.cfg, "test_size") else ""))
        if size is None or size == len(problems):
            return list(problems)
        idx = sorted(random.Random(self.cfg.eval_seed).sample(range(len(problems)), size))
        return [problems[i] for i in idx]

    def check_golds(self, problems: Sequence[Problem]) -> None:
        """Report, once per problem, numeric gold answers that do not parse as a number.

        Such a problem always scores 0 (the verifier compares numbers); it is kept, counted in
        ``unparseable_golds`` and logged by name so the data can be fixed.
        """
        for p in problems:
            if parse_number(p.gold) is None:
                self.unparseable_golds += 1
                log.warning("task %s: gold answer %r of problem %s is not a number; it will always score 0",
                            self.name, p.gold, p.id)

    def use_tool(self, tool) -> None:
        """Rollouts run with ``tool`` (a :class:`harness.tools.ToolRunner`, or None): under
        ``tools.format=chat_template`` the prompt carries its JSON schema (``apply_chat_template(...,
        tools=[schema])``). A task whose worked examples can show a call rewrites them in its
        override (:class:`harness.tasks.arith.ArithTask`); by default the examples stay as they are."""
        chat = tool is not None and tool.params.format == "chat_template"
        self.tool_schemas = [tool.schema()] if chat else None

    # --------------------------------------------------------------------- prompt
    def messages(self, problem: Problem) -> list[dict]:
        """Chat messages: optional system prompt, ``num_shots`` worked examples, the question."""
        msgs = []
        if self.cfg.system_prompt:
            msgs.append({"role": "system", "content": self.cfg.system_prompt})
        for shot in list(self.shots)[: self.cfg.num_shots]:
            msgs.append({"role": "user", "content": self.cfg.instruction.format(question=shot.question)})
            msgs.extend(shot.turns or [{"role": "assistant", "content": shot.answer}])
        msgs.append({"role": "user", "content": self.cfg.instruction.format(question=problem.question)})
        return msgs

    def prompt(self, problem: Problem, tokenizer) -> str:
        """The prompt text through the tokenizer's chat template (generation prompt added; the
        tool's schema when :meth:`use_tool` set one)."""
        return tokenizer.apply_chat_template(
            self.messages(problem), tools=self.tool_schemas, tokenize=False, add_generation_prompt=True
        )

    # -------------------------------------------------------------------- scoring
    def score(self, completions: list[str], golds: list[str]) -> list[Verdict]:
        """Verify completions against gold answers (bounded in time; never raises on model text)."""
        return verify_batch(self.verifier_kind, completions, golds, **self.verify_kwargs())

    def verify_kwargs(self) -> dict:
        return {}

    def step_rewards(self, completion: str) -> list[tuple[int, float]]:
        """Per-step rewards (char end offset, reward) for the ``process`` estimator."""
        return step_rewards(completion)
