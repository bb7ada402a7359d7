"""Cost of a training step per estimator: GRPO (no critic) vs PPO (learned critic), side by side.

Measures, for each model shape, the wall time and peak memory of one full step on the same
batch: rollout (``generate``), old/ref log-probs, critic values (PPO), advantages, and the
policy (+ critic) update. Weights are random (built from a config, no download), so only cost
is measured, never quality; completions are forced to full length so every variant processes
the same tokens. Prints one JSON line per (shape, estimator) and writes them to ``--out``.

    python -m benchmarks.estimator_cost --device cuda --shapes smollm2-135m qwen2.5-0.5b
    python -m benchmarks.estimator_cost --device cpu --shapes tiny --prompts 2 --group-size 4 --new-tokens 16
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch

from harness.algo import TOKEN_ESTIMATORS, AdvantageContext, build_algorithm, estimate_advantages
from harness.train.critic import Critic, ValueModel
from harness.launch.sweep import compose
from harness.train.update import TrainBatch, batched_logprobs, policy_pass

SHAPES = {  # architecture only (public config.json values); weights are random
    "tiny": dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                         rope_theta=100000.0),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                         rope_theta=1000000.0),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                         rope_theta=1000000.0),
}


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _peak(device):
    if device == "cuda":
        return torch.cuda.max_memory_allocated()
    from harness.runtime.perf import PeakMemory

    return PeakMemory().read()


def _reset(device):
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:
        from harness.runtime.perf import PeakMemory

        PeakMemory().reset()


def run_one(shape, estimator, args):
    from transformers import LlamaConfig, LlamaForCausalLM

    dev, dtype = args.device, getattr(torch, args.dtype)
    torch.manual_seed(0)
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, pad_token_id=2, eos_token_id=2)
    policy = LlamaForCausalLM(cfg).to(dev, dtype)
    policy.generation_config.pad_token_id = 2
    ref = copy.deepcopy(policy).eval().requires_grad_(False)
    s = compose(["policy_loss.epsilon=0.2", "beta=0.04", "kl.form=k3", "kl.placement=loss", "loss_agg=token-mean",
                 "rollout.temperature=1.0", f"train.logprob_chunk={args.chunk}", "train.share_prefix=false",
                 f"advantage={estimator}"] + (["critic.lr=1e-6"] if "values" in TOKEN_ESTIMATORS.spec(estimator).needs
                                              else []))
    algo = build_algorithm(s)
    critic = Critic(s.critic, ValueModel(copy.deepcopy(policy)).to(dev, dtype), betas=s.train.adam_betas,
                    max_grad_norm=s.train.max_grad_norm, precision=s.train.precision) if algo.needs("values") else None
    opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    P, G, Tp, Tc, mb = args.prompts, args.group_size, args.prompt_tokens, args.new_tokens, args.micro_batch
    B = P * G
    prompts = torch.randint(3, cfg.vocab_size, (P, Tp), device=dev).repeat_interleave(G, 0)
    pmask = torch.ones_like(prompts)
    times = {}
    _reset(dev)
    _sync(dev)
    t0 = time.perf_counter()
    with torch.no_grad():
        seq = policy.generate(input_ids=prompts, attention_mask=pmask, do_sample=True, temperature=1.0, top_k=0,
                              max_new_tokens=Tc, min_new_tokens=Tc, pad_token_id=2)
    _sync(dev)
    times["rollout_s"] = time.perf_counter() - t0
    comp = seq[:, Tp:]
    cmask = torch.ones_like(comp)
    t0 = time.perf_counter()
    kw = dict(temperature=1.0, chunk=args.chunk, micro_batch_size=mb)
    refl = batched_logprobs(ref, prompts, pmask, comp, cmask, **kw)
    values = critic.values(prompts, pmask, comp, cmask, mb) if critic is not None else None
    _sync(dev)
    times["logprob_s"] = time.perf_counter() - t0
    rewards = torch.randint(0, 2, (B,), device=dev).float()
    tok_r = torch.zeros(B, Tc, device=dev)
    tok_r[:, -1] = rewards
    ctx = AdvantageContext(scores=rewards.view(P, G), token_rewards=tok_r, mask=cmask, values=values)
    adv = estimate_advantages(estimator, ctx)
    t0 = time.perf_counter()
    tb = TrainBatch(prompts, pmask, comp, cmask, adv.advantages, None, refl, values, adv.returns)
    if critic is not None:
        critic.update(tb, mb)
    opt.zero_grad()
    policy_pass(policy, tb, algo, mb)
    opt.step()
    _sync(dev)
    times["update_s"] = time.perf_counter() - t0
    params = sum(p.numel() for p in policy.parameters())
    row = {"shape": shape, "estimator": estimator, "device": dev, "dtype": args.dtype, "params": params,
           "batch": B, "prompt_tokens": Tp, "new_tokens": Tc, **{k: round(v, 3) for k, v in times.items()},
           "step_s": round(sum(times.values()), 3), "peak_mem_gib": round(_peak(dev) / 2**30, 3),
           "rollout_tok_per_s": round(B * Tc / times["rollout_s"], 1)}
    del policy, ref, critic, opt
    if dev == "cuda":
        torch.cuda.empty_cache()
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--shapes", nargs="+", default=["smollm2-135m"], choices=sorted(SHAPES))
    ap.add_argument("--estimators", nargs="+", default=["grpo", "ppo"])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--out", default=None, help="write the JSON lines here")
    args = ap.parse_args(argv)
    rows = []
    for shape in args.shapes:
        run_one(shape, args.estimators[0], args)  # warm-up (kernels, allocator)
        for est in args.estimators:
            rows.append(run_one(shape, est, args))
            print(json.dumps(rows[-1]), flush=True)
        by = {r["estimator"]: r for r in rows if r["shape"] == shape}
        if "grpo" in by and "ppo" in by:
            print(json.dumps({"shape": shape, "ppo_over_grpo_step_time": round(by["ppo"]["step_s"] / by["grpo"]["step_s"], 2),
                              "ppo_over_grpo_peak_mem": round(by["ppo"]["peak_mem_gib"] / by["grpo"]["peak_mem_gib"], 2)}),
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
