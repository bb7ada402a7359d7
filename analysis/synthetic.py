"""Build a small synthetic MLflow store that follows the trainer's logging contract.

Used by the analysis tests and handy for trying the pipeline without training::

    python -m analysis.synthetic --tracking-uri sqlite:///demo.db
    python -m analysis.report --tracking-uri sqlite:///demo.db --out demo_results \\
        --a estimator=grpo --b estimator=ppo

Contents (experiment ``grpo-harness``, tag ``sweep=s1``): estimators grpo/ppo x group sizes
4/8 x seeds 0/1, FINISHED, 4 training steps, eval at steps 0/2/4; plus one FAILED run
(grpo, G=4, seed 2) and one RUNNING run (ppo, G=8, seed 2). Experiment ``other-exp`` holds one
FINISHED run with ``sweep=s0``. Values (exact, for hand checks):

- ``final/eval_accuracy`` = 0.5 (grpo) / 0.4 (ppo) + 0.05 if G=8 + 0.01*seed, plus for ppo
  the offset ``PPO_OFFSET[(G, seed)]``.
- ``train/reward_mean`` at step s = 0.1*s (grpo) / 0.05*s (ppo) + 0.02*seed.
- ``time/step_s`` = G/4 (grpo) / G/2 (ppo) every step; ``time/elapsed_s`` its running sum.
- ``final/peak_mem_bytes`` = (1 + G/4) GiB, times 1.5 for ppo.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag

GIB = 2 ** 30
STEPS = (1, 2, 3, 4)
EVAL_STEPS = (0, 2, 4)
PPO_OFFSET = {(4, 0): 0.0, (4, 1): 0.02, (8, 0): -0.01, (8, 1): 0.03}
T0_MS = 1_700_000_000_000


def final_accuracy(est: str, g: int, seed: int) -> float:
    """Final eval accuracy of the synthetic run (see module docstring)."""
    acc = (0.5 if est == "grpo" else 0.4) + (0.05 if g == 8 else 0.0) + 0.01 * seed
    return round(acc + (PPO_OFFSET.get((g, seed), 0.0) if est == "ppo" else 0.0), 10)


def _run_payload(est: str, g: int, seed: int, sweep: str | None, steps=STEPS):
    step_s = g / 4 * (2.0 if est == "ppo" else 1.0)
    peak = (1 + g / 4) * GIB * (1.5 if est == "ppo" else 1.0)
    final_acc = final_accuracy(est, g, seed)
    metrics = []

    def m(key, value, step):
        metrics.append(Metric(key, float(value), T0_MS + 1000 * step + len(metrics), step))

    for s in steps:
        reward = (0.1 if est == "grpo" else 0.05) * s + 0.02 * seed
        for key, value in {
            "train/reward_mean": reward, "train/reward_std": 0.3, "train/accuracy": reward,
            "train/format_rate": 0.9, "train/frac_reward_zero_std": 0.2,
            "train/completion_len_mean": 100 + 10 * s, "train/completion_len_max": 200,
            "train/clipped_ratio": 0.0, "train/kl": 0.01 * s, "train/clip_frac_low": 0.01,
            "train/clip_frac_high": 0.02, "train/entropy": 1.0, "train/loss": 0.1, "train/grad_norm": 1.0,
            "train/lr": 1e-6, "time/rollout_s": 0.6 * step_s, "time/logprob_s": 0.1 * step_s,
            "time/reward_s": 0.05 * step_s, "time/update_s": 0.25 * step_s, "time/step_s": step_s,
            "time/elapsed_s": step_s * s, "perf/tokens_per_s": 1000.0 / step_s, "perf/peak_mem_bytes": peak,
        }.items():
            m(key, value, s)
    last = max(steps)
    for s in (e for e in EVAL_STEPS if e <= last):
        acc = 0.3 + (final_acc - 0.3) * s / max(EVAL_STEPS)
        for key, value in {"eval/accuracy": acc, "eval/format_rate": 0.95, "eval/mean_at_k": acc,
                           "eval/pass_at_k": min(1.0, acc + 0.2), "eval/num_samples": 4}.items():
            m(key, value, s)
    if last == max(STEPS):
        for key, value in {"final/eval_accuracy": final_acc, "final/peak_mem_bytes": peak,
                           "final/step_time_s_mean": step_s, "final/wall_time_s": step_s * last}.items():
            m(key, value, last)
    params = {"advantage.name": est, "group_size": g, "policy_loss.epsilon": 0.2, "beta": 0.04, "kl.form": "k3",
              "loss_agg": "token_mean", "seed": seed, "task.name": "gsm8k", "model.name_or_path": "tiny",
              "train.lr": 1e-6, "rollout.max_new_tokens": 256, "eval.num_samples": 4}
    tags = {"estimator": est, "group_size": str(g), "task": "gsm8k", "model": "tiny",
            "git_commit": "abc123", "seed": str(seed)}
    if sweep:
        tags["sweep"] = sweep
    return (metrics, [Param(k, str(v)) for k, v in params.items()],
            [RunTag(k, v) for k, v in tags.items()])


def build_synthetic_store(tracking_uri: str, artifact_dir: str | None = None) -> dict[str, list[str]]:
    """Populate ``tracking_uri`` with the synthetic runs; return run ids by status/experiment."""
    client = MlflowClient(tracking_uri=tracking_uri)
    artifact_dir = artifact_dir or tempfile.mkdtemp(prefix="mlartifacts-")
    ids: dict[str, list[str]] = {"FINISHED": [], "FAILED": [], "RUNNING": [], "other": []}

    def exp_id(name: str) -> str:
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return exp.experiment_id
        return client.create_experiment(name, artifact_location=Path(artifact_dir, name).as_uri())

    main_exp, other_exp = exp_id("grpo-harness"), exp_id("other-exp")

    def make(exp, est, g, seed, sweep, status, steps=STEPS):
        run = client.create_run(exp, start_time=T0_MS, run_name=f"{est}-g{g}-s{seed}")
        metrics, params, tags = _run_payload(est, g, seed, sweep, steps)
        client.log_batch(run.info.run_id, metrics=metrics, params=params, tags=tags)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status=status, end_time=T0_MS + 10_000)
        return run.info.run_id

    for est in ("grpo", "ppo"):
        for g in (4, 8):
            for seed in (0, 1):
                ids["FINISHED"].append(make(main_exp, est, g, seed, "s1", "FINISHED"))
    ids["FAILED"].append(make(main_exp, "grpo", 4, 2, "s1", "FAILED", steps=(1, 2)))
    ids["RUNNING"].append(make(main_exp, "ppo", 8, 2, "s1", "RUNNING", steps=(1, 2, 3)))
    ids["other"].append(make(other_exp, "grpo", 4, 0, "s0", "FINISHED"))
    return ids


def paired_studies(rng: np.random.Generator, n_studies: int, n_seeds: int, effect: float = 0.0,
                   seed_sd: float = 0.075, n_problems: int = 250, base: float = 0.4) -> np.ndarray:
    """Simulated paired studies, vectorised: ``[studies, seeds, problems]`` treatment-minus-control
    0/1 verdict differences on a fixed eval set (what :func:`analysis.study.paired_effects` returns
    for one study, per problem).

    Per seed the true paired difference is ``effect + seed_sd * z`` (``z`` standard normal: the
    training noise between seeds that pairing does not cancel); the control arm answers each problem
    with probability ``base``, the treatment with ``base`` plus that difference (clipped to [0, 1]),
    independently per problem (the eval-problem noise). The issue-45 null studies used ``seed_sd``
    7.5 points and 250 problems.
    """
    diff = effect + seed_sd * rng.standard_normal((n_studies, n_seeds, 1))
    p_t = np.clip(base + diff, 0.0, 1.0)
    u = rng.random((2, n_studies, n_seeds, n_problems))
    return (u[1] < p_t).astype(np.int8) - (u[0] < base).astype(np.int8)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.synthetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", required=True, help="e.g. sqlite:///demo.db (must not be your real store)")
    parser.add_argument("--artifact-dir", default=None, help="artifact root for the new experiments")
    args = parser.parse_args(argv)
    ids = build_synthetic_store(args.tracking_uri, args.artifact_dir)
    print({k: len(v) for k, v in ids.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
