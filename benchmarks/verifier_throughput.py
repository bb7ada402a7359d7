"""Throughput of ``verify_batch("math", ...)`` on MATH-500 golds.

For every MATH-500 problem, two typical completions are verified against the gold answer:
one with the gold answer in a sentence and ``\\boxed{}`` (should be correct) and one with a
wrong answer (the next problem's gold; should be incorrect unless the two golds coincide).
Prints verifications/second for a cold pool (includes worker start-up), a warm pool, and the
wrong answers alone (identical strings short-cut through the normaliser; wrong ones do not).

Usage: python benchmarks/verifier_throughput.py [--data PATH] [--workers N] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from harness.verifiers import summarize, verify_batch
from harness.verifiers.math import normalize_answer

# MATH-500 from $HARNESS_MATH_DIR (the Makefile sets it where the development layout has the whole set), else
# the tests' 190-problem excerpt
DEFAULT_DATA = str(Path(os.environ.get("HARNESS_MATH_DIR") or Path(__file__).resolve().parents[1] / "tests" / "data" / "math")
                   / "math500_test.jsonl")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()

    golds = [json.loads(line)["answer"] for line in Path(args.data).read_text().splitlines() if line.strip()]
    wrong = golds[1:] + golds[:1]
    completions, refs, expect = [], [], []
    for gold, other in zip(golds, wrong):
        completions.append(f"Combining the steps above, the answer is $\\boxed{{{gold}}}$.")
        refs.append(gold)
        expect.append(True)
        completions.append(f"Let me double-check... so the final answer is $\\boxed{{{other}}}$.")
        refs.append(gold)
        expect.append(normalize_answer(other) == normalize_answer(gold))

    for label in ("cold", "warm"):
        start = time.perf_counter()
        verdicts = verify_batch("math", completions, refs, timeout_s=args.timeout, num_workers=args.workers)
        elapsed = time.perf_counter() - start
        stats = summarize(verdicts)
        right = sum(v.correct for v, e in zip(verdicts, expect) if e)
        false_pos = sum(v.correct for v, e in zip(verdicts, expect) if not e)
        print(
            f"{label}: {len(verdicts)} verifications in {elapsed:.2f} s = "
            f"{len(verdicts) / elapsed:.1f} verifications/s (workers={args.workers}); "
            f"gold-as-answer accepted {right}/{sum(expect)}, wrong answers accepted {false_pos}, "
            f"timeouts {stats['verifier/timeouts']:.0f}, errors {stats['verifier/errors']:.0f}"
        )

    # the wrong answers alone always go through math_verify (no string short-cut)
    idx = [i for i, e in enumerate(expect) if not e]
    start = time.perf_counter()
    verify_batch(
        "math",
        [completions[i] for i in idx],
        [refs[i] for i in idx],
        timeout_s=args.timeout,
        num_workers=args.workers,
    )
    elapsed = time.perf_counter() - start
    print(f"warm, wrong answers only (full math_verify path): {len(idx) / elapsed:.1f} verifications/s")


if __name__ == "__main__":
    main()
