"""CPU benchmark of the harness against this machine's limits and TRL; writes ``results/benchmarks.md``.

Measured in one run, side by side (these machines are shared and noisy, so only ratios taken
in the same run mean much):

1. bare fp32 matmul GFLOP/s (2048^3), the machine's ceiling;
2. rollout: generated tokens/s of the ``hf`` backend (prefix sharing off and on) vs bare
   ``model.generate`` on the same batch, at batch 8/32/64 of one short prompt and on a real
   GRPO batch (arith 2-shot prompts, P x G rows);
3. training: tokens/s and GFLOP/s (6 x params x tokens / s) of log-probs + backward + AdamW
   through :func:`harness.train.update.policy_pass` on 16 x 384 distinct tokens, and its peak memory
   vs a naive step that materialises full-vocabulary logits;
4. the same update on a real GRPO batch with ``share_prefix`` off and on (A B A B), and the
   padding waste of the training forward on a real rollout;
5. per estimator (grpo, mean_only, rloo, reinforce, ppo): one full trainer step each in a fresh
   process (same prompts), its time split and peak memory, with PPO/GRPO ratios;
6. end to end against TRL ``GRPOTrainer`` on an identical setup, A B A B
   (:mod:`benchmarks.trl_compare`).

    python -m benchmarks.run_all            # ~15-20 min on 2 cores
    python -m benchmarks.run_all --quick    # smaller shapes, no TRL, -> results/benchmarks-quick.md: ~3 min
    python -m benchmarks.run_all --skip-trl # everything but section 6
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path

import torch

from benchmarks import trl_compare
from harness.algo import build_algorithm
from harness.model.models import EMBEDDED_NAME, load_causal_lm, load_tokenizer
from harness.runtime.perf import PeakMemory
from harness.runtime.provenance import cpu_label
from harness.rollout import SamplingParams, build_backend
from harness.launch.sweep import compose
from harness.train.update import TrainBatch, padding_waste, policy_pass

ESTIMATORS = ("grpo", "mean_only", "rloo", "reinforce", "ppo")


def matmul_gflops(n=2048, reps=5, dtype=torch.float32):
    """Bare ``[n, n] @ [n, n]`` GFLOP/s in ``dtype`` (2 n^3 flops per product)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.perf_counter() - t) / 1e9


def rollout_rates(model, tok, prompts, num_samples, new_tokens, order=("bare", "hf", "hf+share")):
    """Generated tokens/s of bare ``generate`` and the ``hf`` backend on the same rows.

    Args:
        prompts: distinct prompt strings; each is sampled ``num_samples`` times (rows group-major).
        order: the variants, run once each in this order.
    Returns:
        ``{variant: tokens/s}``; tokens are real completion tokens (up to and including EOS).
    """
    rows = [p for p in prompts for _ in range(num_samples)]
    enc = tok(rows, return_tensors="pt", padding=True, add_special_tokens=False)
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    with torch.no_grad():  # warm-up, so that the first variant timed pays no one-time costs
        model.generate(**{k: v[:2] for k, v in enc.items()}, do_sample=False, max_new_tokens=2,
                       pad_token_id=tok.pad_token_id)
    out = {}
    for name in order:
        torch.manual_seed(0)
        t = time.perf_counter()
        if name == "bare":
            with torch.no_grad():
                seq = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=new_tokens,
                                     pad_token_id=tok.pad_token_id)
            n = int((seq[:, enc["input_ids"].shape[1]:] != tok.pad_token_id).sum())
        else:
            backend = build_backend("hf", model, tok, progress=False, share_prefix=name == "hf+share")
            n = int(backend.generate(prompts, num_samples, params).completion_mask.sum())
        out[name] = n / (time.perf_counter() - t)
    return out


def _settings(share_prefix=False, chunk=64):
    """The algorithm the update reads: GRPO token-mean, beta 0, the given chunk and prefix sharing."""
    return build_algorithm(compose(["policy_loss.epsilon=0.2", "beta=0.0", "loss_agg=token-mean",
                                    "rollout.temperature=1.0", f"train.logprob_chunk={chunk}",
                                    f"train.share_prefix={str(share_prefix).lower()}"]))


def train_step_cost(model, B, Tp, Tc, naive=False, micro=4, chunk=64):
    """One update (log-probs + backward + AdamW) on ``B x (Tp + Tc)`` random distinct tokens.

    Returns:
        ``{"s", "tok_per_s", "gflops" (6 x params x tokens / s), "peak" (bytes)}``.
    """
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
        policy_pass(model, TrainBatch(p_ids, p_mask, c_ids, c_mask, torch.ones(B, Tc)), _settings(chunk=chunk), micro)
    opt.step()
    opt.zero_grad(set_to_none=True)
    dt = time.perf_counter() - t
    tokens = B * (Tp + Tc)
    return {"s": dt, "tok_per_s": tokens / dt, "gflops": 6 * params * tokens / dt / 1e9, "peak": peak.read()}


def grpo_update_cost(model, batch, micro=8):
    """Seconds of one ``policy_pass`` over a real rollout batch, prefix sharing off / on, A B A B."""
    B, Tc = batch.completion_ids.shape
    adv = torch.randn(B, 1, generator=torch.Generator().manual_seed(0)).expand(B, Tc) * batch.completion_mask
    tb = TrainBatch(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask, adv)
    out = {False: [], True: []}
    for share in (False, True, False, True):
        t = time.perf_counter()
        policy_pass(model, tb, _settings(share_prefix=share), micro)
        model.zero_grad(set_to_none=True)
        out[share].append(time.perf_counter() - t)
    return {k: sum(v) / len(v) for k, v in out.items()}


def arith_prompts(tok, n):
    """The first ``n`` training prompts of ``preset=arith_cpu`` (2-shot), as the trainer renders them."""
    from harness.tasks import build_task

    cfg = trl_compare.compose_cfg(trl_compare.resolve_settings(model="tiny", prompts=n))
    return trl_compare.train_prompts(cfg, build_task(cfg.task), tok, 1)[0]


def estimator_table(quick: bool) -> list[str]:
    """One trainer step per estimator, each in a fresh process on the same prompts."""
    rows, res = [], {}
    for est in ESTIMATORS:
        r = trl_compare.run_comparison(advantage=est, order="A", rounds=1, warmup=0, steps=1,
                                       **(dict(prompts=2, max_new_tokens=24) if quick else {}))
        step = r["raw"][0][0]["steps"][0]
        res[est] = step
        rows.append(f"| {est} | {step['step_s']:.1f} | {step['time/rollout_s']:.1f} | "
                    f"{step.get('time/ref_logprob_s', 0) + step.get('time/old_logprob_s', 0):.1f} | "
                    f"{step.get('time/value_s', 0):.1f} | {step['time/update_s']:.1f} | "
                    f"{step['completion_tokens']:.0f} | {step['peak_mem_bytes'] / 2**30:.2f} |")
    s = r["settings"]
    g, p = res["grpo"], res["ppo"]
    return [f"## Per estimator: one trainer step each (P={s['prompts']} x G={s['group_size']}, "
            f"{s['max_new_tokens']} new tokens, arith, beta={s['beta']}, mu=1, fresh process each, same prompts)", "",
            "| estimator | step s | rollout s | old+ref logprob s | critic values s | update s | completion tokens | "
            "peak RSS GiB |", "|---|---|---|---|---|---|---|---|", *rows, "",
            f"PPO / GRPO: step time **{p['step_s'] / g['step_s']:.2f}x**, update (policy + critic) "
            f"**{p['time/update_s'] / g['time/update_s']:.2f}x**, peak RSS **{p['peak_mem_bytes'] / g['peak_mem_bytes']:.2f}x** "
            "(PPO adds a value forward, a critic backward and a second AdamW state). Completions differ in "
            "length between processes only through sampling; one step each, so read ratios, not seconds.", ""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller shapes, no TRL (a few minutes)")
    ap.add_argument("--skip-trl", action="store_true", help="leave out the TRL comparison")
    ap.add_argument("--out", default=None,
                    help="default results/benchmarks.md; results/benchmarks-quick.md (git-ignored) with --quick")
    args = ap.parse_args(argv)
    args.out = args.out or ("results/benchmarks-quick.md" if args.quick else "results/benchmarks.md")
    t_start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = load_tokenizer(EMBEDDED_NAME)
    model = load_causal_lm(EMBEDDED_NAME)
    cpu = cpu_label()
    lines = ["# Benchmarks (CPU)", "",
             f"Machine: {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
             f"torch {torch.__version__}, fp32, SmolLM2-135M-Instruct (embedded). Date: {time.strftime('%Y-%m-%d')}. "
             "Command: `python -m benchmarks.run_all" + (" --quick" if args.quick else "")
             + (" --skip-trl" if args.skip_trl else "") + "`.", ""]
    mm = matmul_gflops()
    lines += [f"Bare fp32 matmul 2048^3: **{mm:.0f} GFLOP/s**", ""]
    # dtype / threads: what the CPU defaults (fp32, all cores) are chosen from
    threads = torch.get_num_threads()
    bf16 = matmul_gflops(reps=2, dtype=torch.bfloat16)
    torch.set_num_threads(1)
    one = matmul_gflops(reps=2)
    torch.set_num_threads(threads)
    lines += [f"dtype/threads: bf16 matmul {bf16:.0f} GFLOP/s ({bf16 / mm:.2f}x fp32); fp32 on 1 thread "
              f"{one:.0f} GFLOP/s ({mm / one:.2f}x from the second thread). The defaults are fp32 (exact "
              f"on-policy ratios, reproducible runs) and all cores (`train.threads=0`); "
              f"`python -m benchmarks.dtype_probe` times a training step in bf16.", ""]
    write(args.out, lines)

    # 2. rollout
    base = "Ana has 23 apples. She gets 45 more apples. How many apples does Ana have now? Answer:"
    new = 16 if args.quick else 32
    sizes = (8,) if args.quick else (8, 32, 64)
    lines += [f"## Rollout: `hf` backend vs bare `generate` (same rows, {new} new tokens, T=1)", "",
              "`hf` = the backend with `rollout.share_prefix=false`; `hf+share` = the default (each distinct "
              "prompt prefilled once).", "",
              "| rows | bare tok/s | hf tok/s | hf+share tok/s | hf / bare | hf+share / bare |", "|---|---|---|---|---|---|"]
    for b in sizes:
        r = rollout_rates(model, tok, [base], b, new)
        lines.append(f"| {b} x one short prompt (23 tokens) | {r['bare']:.1f} | {r['hf']:.1f} | {r['hf+share']:.1f} | "
                     f"{r['hf'] / r['bare']:.2f} | {r['hf+share'] / r['bare']:.2f} |")
    P, G = (2, 8) if args.quick else (4, 8)
    prompts = arith_prompts(tok, P)
    plen = tok(prompts[0], add_special_tokens=False)["input_ids"]
    r = rollout_rates(model, tok, prompts, G, new)
    lines += [f"| {P} arith 2-shot prompts (~{len(plen)} tokens) x G={G} | {r['bare']:.1f} | {r['hf']:.1f} | "
              f"{r['hf+share']:.1f} | {r['hf'] / r['bare']:.2f} | {r['hf+share'] / r['bare']:.2f} |", ""]

    write(args.out, lines)
    # 3. training on distinct tokens: MFU and peak memory
    B, Tp, Tc = (4, 128, 64) if args.quick else (16, 256, 128)
    ours = train_step_cost(model, B, Tp, Tc)
    naive = train_step_cost(model, B, Tp, Tc, naive=True)
    lines += [f"## Training step on {B} x {Tp + Tc} distinct tokens (log-probs + backward + AdamW)", "",
              "| | s | tokens/s | GFLOP/s (6NT) | of matmul | peak RSS GiB |", "|---|---|---|---|---|---|"]
    for name, r in (("harness (chunked LM head, micro-batch 4)", ours), ("naive (full logits)", naive)):
        lines.append(f"| {name} | {r['s']:.1f} | {r['tok_per_s']:.0f} | {r['gflops']:.0f} | "
                     f"{r['gflops'] / mm:.0%} | {r['peak'] / 2**30:.2f} |")
    lines += ["", f"Peak memory harness / naive: **{ours['peak'] / naive['peak']:.0%}** (RSS high-water mark of "
              "the process, which includes the loaded model and tokenizer on both sides)", ""]

    write(args.out, lines)
    # 4. a real GRPO batch: shared prefix and padding waste
    batch = build_backend("hf", model, tok, progress=False).generate(prompts, G, SamplingParams(0.7, 1.0, 48))
    cost = grpo_update_cost(model, batch)
    pm, cm = batch.prompt_mask, batch.completion_mask
    real = int(pm.sum() + cm.sum())
    slots = batch.prompt_ids.numel() + batch.completion_ids.numel()
    shared_real = int(sum(pm[i * G].sum() for i in range(P)) + cm.sum())
    w_plain, w_share = padding_waste(pm, cm, 8), padding_waste(pm, cm, 8, batch.prompt_ids)
    lines += [f"## A real GRPO batch: {P} arith prompts x G={G}, T=0.7, 48 new tokens "
              f"({int(cm.sum())} completion tokens, {real} prompt+completion tokens)", "",
              "| update (log-probs + backward), micro-batches of 8 | s (mean of 2, A B A B) | tokens/s (prompt+completion) |",
              "|---|---|---|",
              f"| `train.share_prefix=false` | {cost[False]:.1f} | {real / cost[False]:.0f} |",
              f"| `train.share_prefix=true` (default) | {cost[True]:.1f} | {real / cost[True]:.0f} |", "",
              f"Shared prefix: **{cost[False] / cost[True]:.2f}x** faster update; the forward runs "
              f"{shared_real} real tokens instead of {real} ({shared_real / real:.0%}).", "",
              f"Padding waste of the training forward (padded slots vs real tokens): {1 - real / slots:.0%} as one "
              f"padded batch; **{w_plain:.0%}** with length-sorted, trimmed micro-batches of 8 (share_prefix=false); "
              f"**{w_share:.0%}** with share_prefix=true, where each micro-batch is one group: the prompt runs once, "
              f"so the completions' right padding (up to the group's longest) is a larger share of a much smaller "
              f"forward: {shared_real / (1 - w_share):.0f} slots vs {real / (1 - w_plain):.0f}.", ""]

    write(args.out, lines)
    # 5. per estimator, 6. TRL: fresh processes; give back this process's memory first (TRL's
    # step alone peaks near 10 GiB RSS here, and the naive step above left a large heap)
    del model, batch
    gc.collect()
    _malloc_trim()
    lines += estimator_table(args.quick)
    write(args.out, lines)
    if not args.skip_trl and not args.quick:
        result = trl_compare.run_comparison(warmup=1, steps=1)
        lines += trl_compare.markdown(result)
        raw = Path(args.out).with_name("trl_compare.json")
        raw.write_text(json.dumps(result, indent=1, default=str))
        lines += [f"Raw per-step data of both sides: `{raw}`.", ""]
    lines += [f"Total benchmark wall time: {(time.perf_counter() - t_start) / 60:.1f} min", ""]
    print(write(args.out, lines))


def write(path, lines) -> str:
    """Write what is measured so far (a later failure loses nothing already measured)."""
    from benchmarks.rollout_backends import MARK_BEGIN, MARK_END

    text = "\n".join(lines) + "\n"
    old = Path(path).read_text() if Path(path).exists() else ""
    if MARK_BEGIN in old and MARK_END in old:  # the rollout-backend section has its own script: keep it
        text += "\n" + MARK_BEGIN + old.split(MARK_BEGIN, 1)[1].split(MARK_END, 1)[0] + MARK_END + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return text


def _malloc_trim() -> None:
    """Return freed heap pages to the OS (glibc only; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


if __name__ == "__main__":
    main()
