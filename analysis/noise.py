"""Where a study's paired spread comes from, read from committed stores.

For two arms paired by seed, with per-problem greedy verdicts at each eval:

* **Summary metrics.** The per-seed paired difference (treatment - control) of three summaries of the
  eval curve: ``final`` (the last eval), ``last2`` (the mean of the last two evals) and ``auc`` (the
  trapezoid area under the curve over the steps, divided by the last step: a mean accuracy,
  :func:`analysis.ablation.auc`). Reported: the mean and the sd over seeds of each, and their ratio
  (the standardised effect, which sets a paired t's power). Only runs with 3 or more evals say
  anything here: with evals at step 0 and the end only, every summary is the final difference times a
  constant (step 0 is the same untrained model in both arms).
* **Eval noise.** One seed's paired difference on ``n`` problems is a mean of per-problem differences
  ``x = t - c`` in {-1, 0, 1}; its sampling variance over problems is ``(mean(x^2) - mean(x)^2) / n``:
  the discordant fraction minus the squared difference, over ``n``. Averaged over seeds it is the
  eval's share of the observed between-seed variance of the paired difference; the rest is training
  noise (``max(0, sd^2 - eval^2)``). The eval size at which the eval's share equals the training
  share is ``n * eval_var / train_var``.

Run: ``python -m analysis.noise`` (prints markdown tables; reads ``results/ablation`` and every
``studies/*.yaml`` store that has runs).
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

from analysis.ablation import auc, load_sweep
from analysis.study import load_records, load_study, store_uri

SUMMARIES = ("final", "last2", "auc")


def summary_value(steps: list[int], correct: np.ndarray, what: str) -> float:
    """One run's summary of its eval curve (accuracy, 0-1).

    Args:
        steps: the eval steps, ascending (``[E]``).
        correct: ``[E, problems]`` 0/1 greedy verdicts.
        what: ``final``, ``last2`` or ``auc``.
    Raises:
        ValueError: an unknown ``what``, or ``last2`` with fewer than 2 evals.
    """
    acc = correct.mean(axis=1)
    if what == "final":
        return float(acc[-1])
    if what == "last2":
        if len(acc) < 2:
            raise ValueError(f"last2 needs 2 evals, got {len(acc)}")
        return float(acc[-2:].mean())
    if what == "auc":
        return float(auc(steps, correct).mean())
    raise ValueError(f"summary {what!r}: expected one of {SUMMARIES}")


def paired_table(control: dict, treatment: dict) -> dict:
    """Spreads and eval noise of one pair of arms.

    Args:
        control, treatment: ``{seed: RunRecord}`` (:class:`analysis.ablation.RunRecord`).
    Returns:
        ``{"seeds": n, "problems": n, "evals": E, "<summary>": {"mean", "sd", "z"}, "eval_sd": s,
        "train_sd": s, "n_equal": n}`` in accuracy units (0-1); ``sd`` over seeds (ddof 1), ``z`` =
        mean / sd; ``eval_sd``: the root mean per-seed eval sampling variance of the final difference;
        ``train_sd``: ``sqrt(max(0, sd_final^2 - eval_sd^2))``; ``n_equal``: the eval size whose eval
        variance equals ``train_sd^2`` (inf when ``train_sd`` is 0).
    Raises:
        ValueError: fewer than 2 paired seeds, or runs with different eval steps or problem counts.
    """
    seeds = sorted(set(control) & set(treatment))
    if len(seeds) < 2:
        raise ValueError(f"need 2 paired seeds, got {len(seeds)}")
    shapes = {(tuple(r.eval_steps), r.correct.shape[1]) for s in seeds for r in (control[s], treatment[s])}
    if len(shapes) != 1:
        raise ValueError(f"runs differ in eval steps or problem count: {sorted(shapes)}")
    (steps, n), = shapes
    out = {"seeds": len(seeds), "problems": n, "evals": len(steps)}
    for what in SUMMARIES:
        d = np.array([summary_value(list(steps), treatment[s].correct, what)
                      - summary_value(list(steps), control[s].correct, what) for s in seeds])
        sd = float(d.std(ddof=1))
        out[what] = {"mean": float(d.mean()), "sd": sd, "z": float(d.mean() / sd) if sd > 0 else math.inf}
    x = np.stack([treatment[s].correct[-1] - control[s].correct[-1] for s in seeds])  # [seeds, problems]
    eval_var = float(((x ** 2).mean(axis=1) - x.mean(axis=1) ** 2).mean() / n)
    train_var = max(0.0, out["final"]["sd"] ** 2 - eval_var)
    out.update(eval_sd=math.sqrt(eval_var), train_sd=math.sqrt(train_var),
               n_equal=n * eval_var / train_var if train_var > 0 else math.inf)
    return out


def ablation_pairs(root: Path = Path("results/ablation"), sweep: str = "ablation-arith-8steps",
                   control: str = "grpo") -> dict[str, dict]:
    """``{"<estimator> - grpo": paired_table}`` of the committed ablation store."""
    recs = load_sweep(f"sqlite:///{root}/mlflow.db", sweep)
    by = {}
    for r in recs:
        by.setdefault(r.estimator, {})[r.seed] = r
    return {f"{e} - {control}": paired_table(by[control], by[e]) for e in sorted(by) if e != control}


def study_pairs(studies: Path = Path("studies")) -> dict[str, dict]:
    """``{"<study>: <treatment> - <control>": paired_table}`` of every study whose store has 2+ paired
    seeds with per-problem eval verdicts."""
    out = {}
    for f in sorted(studies.glob("*.yaml")):
        spec = load_study(f)
        if spec.get("variant", "cpu") != "cpu" or not Path(store_uri(spec)[len("sqlite:///"):]).exists():
            continue
        recs = load_records(spec)
        for trt in spec.get("comparisons", [spec.get("treatment")]):
            try:
                out[f"{spec['name']}: {trt} - {spec['control']}"] = paired_table(recs[spec["control"]], recs[trt])
            except (ValueError, KeyError):
                continue
    return out


def table(pairs: dict[str, dict]) -> list[str]:
    """Markdown rows: points (x100), sd over seeds, standardised effect per summary, eval noise."""
    lines = ["| pair | seeds x problems, evals | final: mean / sd (z) | last2: mean / sd (z) | auc: mean / sd (z) "
             "| eval sd | train sd | eval size where eval = train |", "|" + "---|" * 8]
    for name, t in pairs.items():
        cells = [f"{t[w]['mean'] * 100:+.1f} / {t[w]['sd'] * 100:.1f} ({t[w]['z']:+.2f})" for w in SUMMARIES]
        n_eq = "inf" if math.isinf(t["n_equal"]) else f"{t['n_equal']:.0f}"
        lines.append(f"| {name} | {t['seeds']} x {t['problems']}, {t['evals']} | " + " | ".join(cells)
                     + f" | {t['eval_sd'] * 100:.1f} | {t['train_sd'] * 100:.1f} | {n_eq} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    print("\n".join(table({**ablation_pairs(), **study_pairs()})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
