"""What a greedy eval of 250, 500 and 1,000 arith problems costs (issue 45, item 2: eval size).

The studies' eval set up (``preset=arith_cpu``, 48 new tokens, ``eval.batch_size=50``, the embedded
model untrained) on the first 1,000 problems of a 1,000-problem test set, in three slices: problems
0-249, 250-499 and 500-999. The batches are the ones a whole eval of 250, 500 or 1,000 problems
runs (50 divides 250), so the cumulative time at 250 / 500 / 1,000 is what those evals cost; the
slices' accuracies are printed to show the untrained model's rate on each.

    python -m benchmarks.eval_cost --threads 1    # as a study job runs (train.threads=1)
    python -m benchmarks.eval_cost --sizes 250 --out /tmp/lean.json rollout=lean   # one backend's 250-problem eval

Writes ``results/eval_cost.json`` (with each problem's sample row: completions to compare backends). Keep the machine quiet; quote its CPU and the date with the figures.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from harness.rollout import eval_decode
from harness.train.evaluation import evaluate
from harness.runtime.provenance import cpu_label
from harness.launch.run import build_components, prepare
from harness.launch.sweep import compose

ROOT = Path(__file__).resolve().parents[1]
SIZES = (250, 500, 1000)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--sizes", type=lambda v: tuple(int(x) for x in v.split(",")), default=SIZES,
                    help="cumulative eval sizes, increasing (default 250,500,1000)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "eval_cost.json")
    ap.add_argument("overrides", nargs="*", help="extra config overrides (model=tiny: a smoke run)")
    a = ap.parse_args(argv)
    sizes = a.sizes
    if list(sizes) != sorted(set(sizes)) or sizes[0] < 1:
        ap.error(f"--sizes: expected increasing positive counts, got {','.join(map(str, sizes))}")
    cfg = compose(["preset=arith_cpu", f"task.test_size={sizes[-1]}", f"task.eval_size={sizes[-1]}",
                   f"eval.size={sizes[-1]}", f"eval.batch_size={a.batch_size}", f"train.threads={a.threads}",
                   "rollout.progress=false", *a.overrides])
    prepare(cfg)  # validates
    task, tokenizer, policy, _, backend = build_components(cfg)
    problems = task.eval[: sizes[-1]]
    rows, elapsed, start, samples = [], 0.0, 0, []
    for n in sizes:
        t0 = time.perf_counter()
        m, batch_samples = evaluate(task, backend, tokenizer, problems[start:n], max_new_tokens=cfg.rollout.max_new_tokens,
                        batch_size=cfg.eval.batch_size, log_samples=n - start)
        elapsed += time.perf_counter() - t0
        samples += batch_samples
        rows.append({"problems": n, "seconds": elapsed, "slice": [start, n], "slice_accuracy": m["eval/accuracy"],
                     "slice_completion_len_mean": m["eval/completion_len_mean"]})
        print(f"{n:5d} problems: {elapsed:7.1f} s cumulative ({elapsed / n:.2f} s a problem); problems {start}-{n - 1}: "
              f"accuracy {m['eval/accuracy']:.3f}, mean completion {m['eval/completion_len_mean']:.1f} tokens", flush=True)
        start = n
    out = {"rows": rows, "batch_size": a.batch_size, "max_new_tokens": cfg.rollout.max_new_tokens,
           "machine": {"cpu": cpu_label(), "cores": os.cpu_count(), "threads": a.threads, "torch": torch.__version__},
           "overrides": a.overrides,
           "decode": eval_decode(cfg.rollout, policy), "samples": samples, "date": time.strftime("%Y-%m-%d")}
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
