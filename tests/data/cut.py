"""Cut the test fixtures in ``tests/data/`` from full copies of GSM8K and MATH (README.md here).

Usage: ``python tests/data/cut.py SOURCE`` where ``SOURCE/gsm8k`` holds GSM8K's ``train.jsonl`` and
``test.jsonl`` and ``SOURCE/math`` MATH's ``train.jsonl`` and MATH-500's ``math500_test.jsonl``
(the layout and keys ``harness.tasks`` reads). Lines are copied byte for byte, in the source's order:

* GSM8K: the first ``GSM8K_ROWS`` lines of each split;
* MATH train: the first ``PER_CELL`` lines of each (subject, level) cell;
* MATH-500: the first ``PER_CELL`` lines of each (subject, level) cell, and every line whose
  ``answer`` is a gold of ``tests/test_verifiers_math_bank.py``'s ``MATH500_CASES``.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
GSM8K_ROWS = 200
PER_CELL = 4


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]


def _per_cell(lines: list[str], extra=lambda row: False) -> list[str]:
    """The first ``PER_CELL`` lines of each (subject, level) cell, and every line ``extra`` keeps."""
    seen, out = Counter(), []
    for line in lines:
        row = json.loads(line)
        cell = (row["subject"], row["level"])
        if seen[cell] < PER_CELL or extra(row):
            out.append(line)
        seen[cell] += 1
    return out


def main(source: Path) -> None:
    sys.path.insert(0, str(HERE.parents[1]))
    from tests.test_verifiers_math_bank import MATH500_CASES

    golds = {gold for _, gold, _ in MATH500_CASES}
    cuts = {
        "gsm8k/train.jsonl": _lines(source / "gsm8k" / "train.jsonl")[:GSM8K_ROWS],
        "gsm8k/test.jsonl": _lines(source / "gsm8k" / "test.jsonl")[:GSM8K_ROWS],
        "math/train.jsonl": _per_cell(_lines(source / "math" / "train.jsonl")),
        "math/math500_test.jsonl": _per_cell(_lines(source / "math" / "math500_test.jsonl"),
                                             lambda row: row["answer"] in golds),
    }
    for name, lines in cuts.items():
        (HERE / name).parent.mkdir(exist_ok=True)
        (HERE / name).write_text("".join(lines), encoding="utf-8")
        print(f"{name}: {len(lines)} lines, {sum(len(x.encode()) for x in lines)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    main(Path(sys.argv[1]))
