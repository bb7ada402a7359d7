"""MATH (Hendrycks et al. 2021): train on MATH train (7,500), evaluate on MATH-500."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness.tasks.base import TASKS, Problem, Shot, Task, TaskConfig
from harness.tasks.data import from_hub, hf_datasets, load_jsonl, require_fields, resolve_data_dir
from harness.verifiers import extract_boxed
from harness.verifiers.batch import MathVerifyParams

ENV_VAR = "HARNESS_MATH_DIR"
FIELDS = ("problem", "answer")

SHOTS = (
    Shot(
        "What is the value of $\\frac{3}{4} + \\frac{1}{6}$?",
        "The common denominator is 12: $\\frac{9}{12} + \\frac{2}{12} = \\frac{11}{12}$.\n"
        "The answer is $\\boxed{\\frac{11}{12}}$.",
    ),
    Shot(
        "Solve for $x$: $2x - 7 = 11$.",
        "Adding 7 gives $2x = 18$, so $x = 9$.\nThe answer is $\\boxed{9}$.",
    ),
)


@dataclass
class MathTaskConfig(TaskConfig):
    """MATH train / MATH-500 eval. Local files: task.data_dir or HARNESS_MATH_DIR; else the hub."""

    name: str = "math"
    eval_size: Optional[int] = 100
    instruction: str = "Solve the problem step by step. Put the final answer in \\boxed{{}}.\n\n{question}"
    format_reward: float = 0.2
    data_dir: Optional[str] = "${oc.env:HARNESS_MATH_DIR,null}"  # train.jsonl/math500_test.jsonl; None = hub
    hub_train_id: str = "EleutherAI/hendrycks_math"
    hub_eval_id: str = "HuggingFaceH4/MATH-500"
    levels: Optional[list] = None  # e.g. [1, 2]
    subjects: Optional[list] = None  # e.g. [Algebra, Prealgebra]
    # per-check deadline; a check past it scores 0 (status timeout)
    verify_timeout_s: float = MathVerifyParams.timeout_s
    verify_workers: int = MathVerifyParams.num_workers  # verifier worker processes (speed only)
    strict: bool = False  # malformed rows: error naming file:line (True) or skip + count (False)


@TASKS.register("math", params=MathTaskConfig)
class MathTask(Task):
    """MATH train / MATH-500 from ``task.data_dir`` (``$HARNESS_MATH_DIR``) or the hub.

    Local files: ``train.jsonl`` and ``math500_test.jsonl`` with fields ``problem, solution,
    answer, subject, level, unique_id``. Optional filters ``task.levels``/``task.subjects``
    apply to both splits.
    """

    name = "math"
    verifier_kind = "math"
    shots = SHOTS

    def __init__(self, cfg):
        super().__init__(cfg)
        data_dir = resolve_data_dir(cfg.data_dir, ENV_VAR)
        if data_dir is not None:
            train_rows = self._rows(data_dir / "train.jsonl")
            eval_rows = self._rows(data_dir / "math500_test.jsonl")
        else:
            with from_hub(self.name, (cfg.hub_train_id, cfg.hub_eval_id), ENV_VAR, "train.jsonl and math500_test.jsonl"):
                train_rows, eval_rows = self._hub_rows()
        self.train = self._filter(train_rows)
        if cfg.train_size:
            self.train = self.train[: cfg.train_size]
        self.eval = self.pick_eval(self._filter(eval_rows))

    def _rows(self, path):
        self.record_source("train" if path.name == "train.jsonl" else "test", path)
        rows, lines, skipped = require_fields(load_jsonl(path), FIELDS, str(path), self.cfg.strict)
        self.skipped_rows += skipped
        return [dict(r, _line=f"{path.name}:{n}") for r, n in zip(rows, lines)]

    def _hub_rows(self):
        cfg = self.cfg
        names = hf_datasets().get_dataset_config_names(cfg.hub_train_id)
        train = []
        for name in names:
            for r in hf_datasets().load_dataset(cfg.hub_train_id, name, split="train"):
                level = str(r.get("level", "")).replace("Level ", "")
                train.append({
                    "problem": r["problem"], "answer": extract_boxed(r["solution"]) or "",
                    "subject": r.get("type"), "level": int(level) if level.isdigit() else None,
                })
        evals = hf_datasets().load_dataset(cfg.hub_eval_id, split="test")
        self.record_source("train", f"hub:{cfg.hub_train_id}[{','.join(names)}]")
        self.record_source("test", f"hub:{cfg.hub_eval_id}[test]", getattr(evals, "_fingerprint", ""))
        evals = evals.to_list()
        keep = lambda rows, src: require_fields(rows, FIELDS, src, cfg.strict)  # noqa: E731
        train, _, s1 = keep(train, cfg.hub_train_id)
        evals, _, s2 = keep(evals, cfg.hub_eval_id)
        self.skipped_rows += s1 + s2
        return train, evals

    def _filter(self, rows) -> list[Problem]:
        cfg = self.cfg
        out = []
        for i, r in enumerate(rows):
            if cfg.levels and r.get("level") not in cfg.levels:
                continue
            if cfg.subjects and r.get("subject") not in cfg.subjects:
                continue
            pid = r.get("unique_id") or r.get("_line") or str(i)
            meta = {"subject": r.get("subject"), "level": r.get("level")}
            out.append(Problem(pid, r["problem"], str(r["answer"]), meta))
        if not out:
            raise ValueError(
                f"task.levels={cfg.levels} task.subjects={cfg.subjects} leave no MATH problems; "
                "expected levels in 1..5 and subjects such as 'Algebra', 'Prealgebra'"
            )
        return out

    def verify_kwargs(self) -> dict:
        return {"timeout_s": self.cfg.verify_timeout_s, "num_workers": self.cfg.verify_workers}
