"""CPU benchmark of the harness against this machine's limits; writes ``results/benchmarks.md``.

Measured in one process, side by side (these machines are shared and noisy, so only ratios
taken in the same run mean much):

1. bare fp32 matmul GFLOP/s (2048^3), the machine's ceiling;
2. rollout: tokens/s of the ``hf`` backend vs bare ``model.generate`` on the same batch;
3. training: tokens/s and GFLOP/s (6 x params x tokens / s) of log-probs + backward +
   AdamW through :func:`harness.update.policy_pass`, and the peak memory of that step vs a
   naive step that materialises full-vocabulary logits;
4. padding waste of the training forward (padded slots vs real tokens) for a real rollout.

    python -m benchmarks.run_all [--quick]

TRL's GRPOTrainer is not compared here (see the README's benchmark section).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from harness.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
from harness.perf import PeakMemory
from harness.rollout import SamplingParams
from harness.rollout.hf import HFRollout
from harness.update import LossSettings, TrainBatch, padding_waste, policy_pass


def matmul_gflops(n=2048, reps=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def rollout_ratio(model, tok, prompts, new_tokens):
    backend = HFRollout(model, tok, progress=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = {}
    for name in ("bare", "hf", "bare", "hf"):  # A B A B
        torch.manual_seed(0)
        t = time.perf_counter()
        if name == "bare":
            with torch.no_grad():
                seq = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new_tokens,
                                     pad_token_id=tok.pad_token_id)
            n = int((seq[:, enc["input_ids"].shape[1]:] != tok.pad_token_id).sum())
        else:
            b = backend.generate(prompts, 1, params)
            n = int(b.completion_mask.sum())
        out.setdefault(name, []).append(n / (time.perf_counter() - t))
    return {k: sum(v) / len(v) for k, v in out.items()}


def train_step_cost(model, B, Tp, Tc, naive=False, micro=4, chunk=64):
    params = sum(p.numel() for p in model.parameters())
    g = torch.Generator().manual_seed(0)
    p_ids, c_ids = torch.randint(3, 40000, (B, Tp), generator=g), torch.randint(3, 40000, (B, Tc), generator=g)
    p_mask, c_mask = torch.ones(B, Tp, dtype=torch.long), torch.ones(B, Tc, dtype=torch.long)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    peak = PeakMemory()
    peak.reset()
    t = time.perf_counter()
    if naive:  # one forward over the whole batch, full-vocabulary logits kept for backward
        logits = model(torch.cat([p_ids, c_ids], 1)).logits[:, Tp - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, c_ids.unsqueeze(-1)).squeeze(-1)
        (-logp.mean()).backward()
    else:
        s = LossSettings(epsilon=0.2, epsilon_high=None, dual_clip=None, ratio_level="token", beta=0.0,
                         kl_form="k3", kl_in_loss=True, entropy_coef=0.0, loss_agg="token-mean",
                         loss_agg_constant=None, temperature=1.0, chunk=chunk)
        policy_pass(model, TrainBatch(p_ids, p_mask, c_ids, c_mask, torch.ones(B, Tc)), s, micro)
    opt.step()
    opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t
    tokens = B * (Tp + Tc)
    return {"s": dt, "tok_per_s": tokens / dt, "gflops": 6 * params * tokens / dt / 1e9, "peak": peak.read()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller batches (a few minutes)")
    ap.add_argument("--out", default="results/benchmarks.md")
    args = ap.parse_args(argv)
    tok = load_tokenizer(EMBEDDED_NAME)
    model = load_causal_lm(EMBEDDED_NAME)
    lines = ["# Benchmarks (CPU)", "", f"Machine: {platform.processor() or platform.machine()}, "
             f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, fp32, SmolLM2-135M.", ""]
    mm = matmul_gflops()
    lines += [f"Bare fp32 matmul 2048^3: **{mm:.0f} GFLOP/s**", ""]
    base = "Ana has 23 apples. She gets 45 more apples. How many apples does Ana have now? Answer:"
    sizes = (8,) if args.quick else (8, 32, 64)
    lines += ["## Rollout: `hf` backend vs bare `generate` (same prompts, 64 new tokens, A B A B)", "",
              "| batch | bare tok/s | hf tok/s | ratio |", "|---|---|---|---|"]
    for b in sizes:
        r = rollout_ratio(model, tok, [base] * b, 64)
        lines.append(f"| {b} | {r['bare']:.1f} | {r['hf']:.1f} | {r['hf'] / r['bare']:.2f} |")
    B, Tp, Tc = (4, 128, 64) if args.quick else (16, 256, 128)
    ours = train_step_cost(model, B, Tp, Tc)
    naive = train_step_cost(model, B, Tp, Tc, naive=True)
    lines += ["", f"## Training step on {B} x {Tp + Tc} tokens (log-probs + backward + AdamW)", "",
              "| | s | tokens/s | GFLOP/s (6NT) | of matmul | peak RSS GiB |", "|---|---|---|---|---|---|"]
    for name, r in (("harness (chunked LM head, micro-batch 4)", ours), ("naive (full logits)", naive)):
        lines.append(f"| {name} | {r['s']:.1f} | {r['tok_per_s']:.0f} | {r['gflops']:.0f} | "
                     f"{r['gflops'] / mm:.0%} | {r['peak'] / 2**30:.2f} |")
    lines += ["", f"Peak memory harness / naive: **{ours['peak'] / naive['peak']:.0%}**", ""]
    # padding waste for a real rollout batch of the arith task
    backend = HFRollout(model, tok, progress=False)
    batch = backend.generate([base, base + " Think step by step."] * 4, 4, SamplingParams(0.7, 1.0, 48))
    real = int(batch.prompt_mask.sum() + batch.completion_mask.sum())
    slots = batch.prompt_ids.numel() + batch.completion_ids.numel()
    bucketed = padding_waste(batch.prompt_mask, batch.completion_mask, 8)
    lines += ["Padding waste of the training forward (32 sequences, arith prompts of 2 lengths, 48 new tokens): "
              f"{1 - real / slots:.0%} of {slots} slots as one padded batch; **{bucketed:.0%}** with the "
              "trainer's length-sorted, trimmed micro-batches of 8", ""]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
