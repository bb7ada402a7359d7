"""``rollout.kv_cache``: the hf backend's decoding cache, ``dynamic`` vs ``static``, side by side.

The embedded SmolLM2-135M in fp32, the hf backend with its defaults (shared prompt prefill,
seeded rows), two workloads:

* ``arith``: the real GRPO batch of ``preset=arith_cpu`` (2-shot arith prompts of ~233 tokens,
  T=0.7, 48 new tokens; completions stop at ~16 tokens) at P = 4 and 8 prompts x G = 8;
* ``long``: open-ended chat prompts (completions run to the limit), T=1, 128 new tokens, P=4 x G=8.

Each (workload, batch) is timed ``--rounds`` times, the two caches alternating after a warm-up of
each; the table gives the best wall seconds of a ``generate`` call, completion tokens/s, and
whether the two caches sampled the same tokens (in fp32 the two attention paths round
differently, so a near-tie may flip a token; ``tests/test_static_cache.py`` checks equality in
float64). Run the machine quiet: ``python -m benchmarks.kv_cache [--rounds 2]``; appends to
``results/kv_cache.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from benchmarks.run_all import arith_prompts
from harness.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
from harness.rollout import SamplingParams, build_backend

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ["a lighthouse keeper", "a lost robot", "the first rain on Mars", "a chess prodigy"]


def workloads(tok) -> dict[str, tuple[list[str], SamplingParams]]:
    """``{name: (prompts, sampling)}``: see the module docstring."""
    long = [tok.apply_chat_template([{"role": "user", "content": f"Write a long story about {t}, with many details."}],
                                    tokenize=False, add_generation_prompt=True) for t in TOPICS]
    arith8 = arith_prompts(tok, 8)
    return {"arith P=4": (arith8[:4], SamplingParams(0.7, 1.0, 48, seed=0)),
            "arith P=8": (arith8, SamplingParams(0.7, 1.0, 48, seed=0)),
            "long P=4": (long, SamplingParams(1.0, 1.0, 128, seed=0))}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--only", nargs="+", help="workload names (default: all)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "kv_cache.jsonl")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    tok = load_tokenizer(EMBEDDED_NAME)
    model = load_causal_lm(EMBEDDED_NAME, "float32").eval()
    backends = {kv: build_backend("hf", model, tok, progress=False, kv_cache=kv) for kv in ("dynamic", "static")}
    rows = []
    for name, (prompts, params) in workloads(tok).items():
        if a.only and name not in a.only:
            continue
        times, out = {kv: [] for kv in backends}, {}
        for kv, b in backends.items():  # warm-up
            out[kv] = b.generate(prompts, a.group_size, params)
        for _ in range(a.rounds):
            for kv, b in backends.items():
                t = time.perf_counter()
                b.generate(prompts, a.group_size, params)
                times[kv].append(time.perf_counter() - t)
        tokens = int(out["dynamic"].completion_mask.sum())
        same = (out["dynamic"].completion_ids.shape == out["static"].completion_ids.shape
                and torch.equal(out["dynamic"].completion_ids, out["static"].completion_ids))
        row = {"workload": name, "rows": len(prompts) * a.group_size, "max_new_tokens": params.max_new_tokens,
               "completion_tokens": tokens, "dynamic_s": min(times["dynamic"]), "static_s": min(times["static"]),
               "same_tokens": same, "threads": a.threads, "machine": platform.processor() or platform.machine(),
               "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "raw": times}
        row["speedup_static"] = row["dynamic_s"] / row["static_s"]
        rows.append(row)
        print(f"{name:10s} {row['rows']:3d} rows {tokens:5d} tokens: dynamic {row['dynamic_s']:6.2f} s, static "
              f"{row['static_s']:6.2f} s ({row['speedup_static']:.2f}x), same tokens: {same}", flush=True)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return rows


if __name__ == "__main__":
    main()
