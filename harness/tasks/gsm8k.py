"""GSM8K (Cobbe et al. 2021): grade-school word problems, answer after the last ``#### ``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from harness.tasks.base import TASKS, Problem, Shot, Task, TaskConfig
from harness.tasks.data import from_hub, hf_datasets, load_jsonl, require_fields, resolve_data_dir

ENV_VAR = "HARNESS_GSM8K_DIR"

# Hand-written worked examples in the GSM8K answer style (not taken from the data set).
SHOTS = (
    Shot(
        "A baker makes 24 muffins in the morning and 18 in the afternoon. He sells 30. "
        "How many muffins are left?",
        "He makes 24 + 18 = 42 muffins.\nAfter selling 30, 42 - 30 = 12 are left.\n#### 12",
    ),
    Shot(
        "Sara reads 15 pages a day for 4 days, then 10 pages on the fifth day. "
        "How many pages does she read in total?",
        "In 4 days she reads 15 * 4 = 60 pages.\nWith the fifth day, 60 + 10 = 70 pages.\n#### 70",
    ),
)


def gold_from_answer(answer: str) -> str:
    """The gold final answer: the text after the last ``#### `` of a GSM8K ``answer`` field."""
    return answer.rsplit("####", 1)[-1].strip().replace(",", "")


@dataclass
class GSM8KTaskConfig(TaskConfig):
    """GSM8K. Local files: task.data_dir=<folder> or HARNESS_GSM8K_DIR; else the hub (``hub_id``)."""

    name: str = "gsm8k"
    eval_size: Optional[int] = 48
    num_shots: int = 0
    instruction: str = ("Solve the problem step by step. End your answer with a line of the form "
                        "'#### <number>'.\n\n{question}")
    format_reward: float = 0.5
    data_dir: Optional[str] = "${oc.env:HARNESS_GSM8K_DIR,null}"  # train.jsonl/test.jsonl; None = hub
    hub_id: str = "openai/gsm8k"
    hub_config: str = "main"
    strict: bool = False  # malformed rows: error naming file:line (True) or skip + count (False)


@TASKS.register("gsm8k", params=GSM8KTaskConfig)
class GSM8KTask(Task):
    """GSM8K from ``task.data_dir`` / ``$HARNESS_GSM8K_DIR`` (train.jsonl, test.jsonl) or the hub."""

    name = "gsm8k"
    verifier_kind = "gsm8k"
    shots = SHOTS

    def __init__(self, cfg):
        super().__init__(cfg)
        data_dir = resolve_data_dir(cfg.data_dir, ENV_VAR)
        if data_dir is not None:
            raw = {split: self._local_rows(data_dir / f"{split}.jsonl", split) for split in ("train", "test")}
        else:
            with from_hub(self.name, (cfg.hub_id,), ENV_VAR, "train.jsonl and test.jsonl"):
                raw = {split: self._hub_rows(split) for split in ("train", "test")}
        splits = {}
        for split, (rows, source) in raw.items():
            rows, lines, skipped = require_fields(rows, ("question", "answer"), source, cfg.strict)
            self.skipped_rows += skipped
            splits[split] = [
                Problem(f"{split}/{line}", r["question"], gold_from_answer(r["answer"]))
                for r, line in zip(rows, lines)
            ]
        self.check_golds(splits["train"] + splits["test"])
        train = splits["train"]
        self.train = train[: cfg.train_size] if cfg.train_size else train
        self.eval = self.pick_eval(splits["test"])

    def _local_rows(self, path, split: str) -> tuple[list[dict], str]:
        """``(rows, source)`` of one split's local JSONL file."""
        self.record_source(split, path)
        return load_jsonl(path), str(path)

    def _hub_rows(self, split: str) -> tuple[list[dict], str]:
        """``(rows, source)`` of one split of ``task.hub_id`` / ``task.hub_config``."""
        cfg = self.cfg
        ds = hf_datasets().load_dataset(cfg.hub_id, cfg.hub_config, split=split)
        self.record_source(split, f"hub:{cfg.hub_id}/{cfg.hub_config}[{split}]", getattr(ds, "_fingerprint", ""))
        return ds.to_list(), f"{cfg.hub_id}[{split}]"
