"""Measure how much GRPO signal a task gives the policy before training.

Prints greedy accuracy, format rate, and for k samples per problem at the rollout temperature:
mean accuracy (mean@k), unbiased pass@k and the fraction of groups whose rewards are all
equal (no GRPO signal). Any Hydra override of the main config applies, e.g.::

    python -m benchmarks.calibrate_task task=arith eval.size=100 eval.num_samples=8 rollout.temperature=0.7
"""

from __future__ import annotations

import sys
import time

import torch


def main(argv: list[str]) -> None:
    from hydra import compose, initialize_config_dir
    from pathlib import Path

    from harness.launch.config import register_configs
    from harness.train.evaluation import evaluate
    from harness.model.models import load_tokenizer
    from harness.rollout import SamplingParams, build_backend
    from harness.launch.run import build_policy
    from harness.tasks import build_task

    register_configs()
    with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[1] / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=argv)
    torch.manual_seed(cfg.seed)
    task = build_task(cfg.task)
    tok = load_tokenizer(cfg.model.name_or_path)
    model = build_policy(cfg, tok).eval()
    backend = build_backend("hf", model, tok, progress=False)
    problems = task.eval[: cfg.eval.size]
    k = cfg.eval.num_samples or 8
    t0 = time.time()
    m, _ = evaluate(task, backend, tok, problems, max_new_tokens=cfg.rollout.max_new_tokens,
                    batch_size=cfg.eval.batch_size)
    t1 = time.time()
    prompts = [task.prompt(p, tok) for p in problems]
    params = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    rewards = []
    per = max(1, cfg.eval.batch_size // k)
    for s in range(0, len(prompts), per):
        out = backend.generate(prompts[s : s + per], k, params)
        golds = [p.gold for p in problems[s : s + per] for _ in range(k)]
        v = task.score(out.texts, golds)
        rewards += [x.correct + cfg.task.format_reward * x.formatted for x in v]
    r = torch.tensor(rewards, dtype=torch.float32).view(len(problems), k)
    from harness.algo import pass_at_k

    correct = (r >= 1).float()
    print(f"task={cfg.task.name} n={len(problems)} k={k} temperature={cfg.rollout.temperature} "
          f"num_shots={cfg.task.num_shots} max_new_tokens={cfg.rollout.max_new_tokens}")
    print(f"greedy accuracy {m['eval/accuracy']:.3f}  format rate {m['eval/format_rate']:.3f}  ({t1 - t0:.0f} s)")
    print(f"sampled mean@{k} {correct.mean():.3f}  pass@{k} "
          f"{sum(pass_at_k(k, int(c), k) for c in correct.sum(1)) / len(problems):.3f}  "
          f"groups with all-equal reward {(r.std(1) == 0).float().mean():.3f}  ({time.time() - t1:.0f} s)")


if __name__ == "__main__":
    main(sys.argv[1:])
