"""The estimator ablation report: ``results/ABLATION.md`` from the MLflow runs of one sweep.

    python -m analysis.ablation --tracking-uri sqlite:///results/ablation/mlflow.db \\
        --sweep ablation-arith-8steps --out results

For each estimator (runs grouped by the ``estimator`` tag, seeds by the ``seed`` tag):

* **final greedy accuracy** and **area under the eval curve** (trapezoid over the eval steps
  divided by the step span: the mean accuracy over training), with 95% intervals from a
  two-level bootstrap that resamples seeds *and* eval problems (the per-problem verdicts each
  eval logs as ``eval/correct_step_*.json``), so the interval carries both the training noise
  between seeds and the eval-sample noise, and, being a percentile interval of means of 0/1
  verdicts, stays inside [0, 1];
* **paired differences vs the baseline** (``--baseline``, grpo): the same seed (same initial
  model, prompts and sampling seeds) and the same problems on both sides; the bootstrap interval
  of the mean difference, a two-sided bootstrap p-value, and a paired t-test over seeds
  (secondary: 3 seeds give it 2 degrees of freedom);
* **cost**: mean step time (steps after the first) and peak memory per estimator;
* **power**: from the measured spread of the per-seed paired differences (which includes the
  eval-problem noise of a fixed eval set), the difference a two-sided paired t-test at the 5% level
  over the seeds run detects with 80% power, and the seeds a 5-point difference needs for 80% power,
  both exact (noncentral t: :func:`analysis.stats.min_detectable`, :func:`analysis.stats.seeds_for_power`,
  the study reports' figures);
* plots ``results/plots/ablation_accuracy_vs_step.png`` and ``..._vs_time.png`` (mean, bootstrap
  band, every seed drawn thin).

Beside a sqlite store, ``command.txt`` (the command that produced the runs) and ``notes.md``
(paragraphs, e.g. about how the runs were scheduled) are quoted in the report. Only FINISHED
runs are used; the sweep's provenance (commit, dirty tree, versions) is listed, and
runs that differ in it are flagged. ``results/precision_cpu.json`` (``benchmarks.precision_step``),
when present, adds the measured bf16-autocast vs fp32 section.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient

from analysis import stats
from analysis.collect import find_duplicates
from harness.launch.tracking import artifact_path

POWER_DELTA = 0.05  # the difference (5 points of accuracy) the power statement is about

@dataclass
class RunRecord:
    """What the report needs from one MLflow run."""

    run_id: str
    estimator: str
    seed: int
    eval_steps: list[int]
    correct: np.ndarray  # [n_evals, n_problems] 0/1 greedy verdicts, eval-set order
    elapsed_at: dict[int, float]  # step -> time/elapsed_s
    step_time_s: float
    peak_mem_gib: float
    params: dict = field(default_factory=dict)


def load_sweep(uri: str, sweep: str, experiment: str = "grpo-harness") -> list[RunRecord]:
    """The FINISHED runs of ``sweep`` with their per-problem eval verdicts.

    Raises:
        ValueError: no such experiment or no finished run in the sweep (naming them).
    """
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ValueError(f"experiment {experiment!r} not found in {uri!r}")
    runs = client.search_runs([exp.experiment_id], f"tags.sweep = '{sweep}' and attributes.status = 'FINISHED'",
                              max_results=5000)
    if not runs:
        raise ValueError(f"no FINISHED run with tag sweep={sweep!r} in {uri!r}")
    runs = drop_duplicate_runs(runs)
    out = []
    for run in runs:
        rid = run.info.run_id
        evals = sorted(m.step for m in client.get_metric_history(rid, "eval/accuracy"))
        rows = []
        for s in evals:
            rec = json.loads(artifact_path(client, run, f"eval/correct_step_{s:06d}.json", uri).read_text())
            rows.append(rec["correct"])
        elapsed = {m.step: m.value for m in client.get_metric_history(rid, "time/elapsed_s")}
        steps = [m.value for m in client.get_metric_history(rid, "time/step_s") if m.step > 1]
        mem = [m.value for m in client.get_metric_history(rid, "perf/peak_mem_gib")]
        out.append(RunRecord(rid, run.data.tags["estimator"], int(run.data.tags["seed"]), evals,
                             np.asarray(rows, dtype=float), elapsed, float(np.mean(steps)) if steps else math.nan,
                             max(mem) if mem else math.nan, dict(run.data.params)))
    return out


def drop_duplicate_runs(runs: list) -> list:
    """``runs`` (MLflow ``Run`` objects) without the duplicates of one job that older harness
    versions left (:func:`analysis.collect.find_duplicates`: the latest-started run of each
    ``config_key`` is kept); each dropped run is named in a warning on stderr."""
    frame = pd.DataFrame([{"run_id": r.info.run_id, "experiment": r.info.experiment_id, "status": r.info.status,
                           "start_time": r.info.start_time, "tags.config_key": r.data.tags.get("config_key"),
                           "tags.rerun_of": r.data.tags.get("rerun_of"), "run_name": r.info.run_name,
                           "estimator": r.data.tags.get("estimator"), "seed": r.data.tags.get("seed")} for r in runs])
    dup = find_duplicates(frame)
    for _, d in dup.iterrows():
        print(f"[ablation] warning: run {d['run_id']} ({d['run_name']}, seed {d['seed']}) duplicates "
              f"{d['duplicate_of']} (config_key {d['config_key']}): dropped", file=sys.stderr)
    gone = set(dup["run_id"])
    return [r for r in runs if r.info.run_id not in gone]


def auc(steps, acc) -> np.ndarray:
    """Trapezoid area of ``acc`` (``[n_evals, ...]``) over ``steps`` divided by the step span."""
    s = np.asarray(steps, dtype=float)
    a = np.asarray(acc, dtype=float)
    if len(s) < 2:
        return a[0]
    w = np.zeros(len(s))
    d = np.diff(s)
    w[:-1] += d / 2
    w[1:] += d / 2
    return np.tensordot(w / (s[-1] - s[0]), a, axes=(0, 0))


def _by_estimator(records: list[RunRecord]) -> dict[str, dict[int, RunRecord]]:
    out: dict[str, dict[int, RunRecord]] = {}
    for r in records:
        out.setdefault(r.estimator, {})[r.seed] = r
    return out


def per_problem(rec: RunRecord, what: str) -> np.ndarray:
    """``[problems]``: final verdicts (``final``) or per-problem area under the eval curve (``auc``)."""
    return rec.correct[-1] if what == "final" else auc(rec.eval_steps, rec.correct)


def analyse(records: list[RunRecord], baseline: str = "grpo", n_boot: int = 2000, seed: int = 0) -> dict:
    """All the numbers of the report (see the module docstring)."""
    rng = np.random.default_rng(seed)
    groups = _by_estimator(records)
    estimators = sorted(groups, key=lambda e: (e != baseline, e))
    n_problems = {r.correct.shape[1] for r in records}
    if len(n_problems) != 1:
        raise ValueError(f"runs evaluated different numbers of problems: {sorted(n_problems)}")
    summary, paired = [], []
    for est in estimators:
        runs = [groups[est][s] for s in sorted(groups[est])]
        row = {"estimator": est, "seeds": len(runs)}
        for what in ("final", "auc"):
            vals = np.stack([per_problem(r, what) for r in runs])
            row[what] = float(vals.mean())
            draws = stats.two_level_bootstrap(vals, n_boot, rng)
            row[f"{what}_lo"], row[f"{what}_hi"] = stats.percentile_interval(draws)
            row[f"{what}_seeds"] = [float(v) for v in vals.mean(axis=1)]
        row["step_time_s"] = float(np.mean([r.step_time_s for r in runs]))
        row["step_time_min"], row["step_time_max"] = min(r.step_time_s for r in runs), max(r.step_time_s for r in runs)
        row["peak_mem_gib"] = float(np.mean([r.peak_mem_gib for r in runs]))
        row["initial"] = float(np.mean([r.correct[0].mean() for r in runs]))
        summary.append(row)
        if est == baseline or baseline not in groups:
            continue
        seeds = sorted(set(groups[est]) & set(groups[baseline]))
        for what in ("final", "auc"):
            d = np.stack([per_problem(groups[est][s], what) - per_problem(groups[baseline][s], what) for s in seeds])
            draws = stats.two_level_bootstrap(d, n_boot, rng)
            per_seed = d.mean(axis=1)
            lo, hi = stats.percentile_interval(draws)
            p_boot = stats.bootstrap_p(draws)
            t_p = stats.paired_t_p(per_seed)
            sd = float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else math.nan
            paired.append({"estimator": est, "metric": what, "pairs": len(seeds), "diff": float(d.mean()),
                           "lo": lo, "hi": hi, "p_boot": p_boot, "p_t": t_p, "sd_seed": sd})
    sds = [p["sd_seed"] for p in paired if p["metric"] == "final" and not math.isnan(p["sd_seed"])]
    sd_pooled = float(np.sqrt(np.mean(np.square(sds)))) if sds else math.nan
    n_seeds = min((p["pairs"] for p in paired), default=0)
    power = {"sd_pooled": sd_pooled, "delta": POWER_DELTA, "seeds": n_seeds,
             "seeds_needed": stats.seeds_for_power({"kind": "difference", "delta": POWER_DELTA, "alpha": 0.05},
                                                   sd_pooled) if sds else None,
             "mde": stats.min_detectable(sd_pooled, n_seeds) if sds and n_seeds >= 2 else math.nan,
             "problems": n_problems.pop(),
             "se_one_run": float(np.sqrt(np.mean([r.correct[-1].mean() * (1 - r.correct[-1].mean())
                                                  for r in records]) / records[0].correct.shape[1]))}
    return {"summary": summary, "paired": paired, "power": power, "baseline": baseline}


def plot(records: list[RunRecord], out_dir: Path, n_boot: int = 2000) -> list[Path]:
    """Accuracy vs step and vs wall clock: mean per estimator, bootstrap band over seeds and
    problems, every seed as a thin line."""
    import matplotlib  # heavy, only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy, only for plots
    from analysis.plots import integer_steps  # imports matplotlib: only for plots

    rng = np.random.default_rng(1)
    groups = _by_estimator(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for xkind in ("step", "time"):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if xkind == "step":
            integer_steps(ax)
        for est in sorted(groups):
            runs = [groups[est][s] for s in sorted(groups[est])]
            steps = runs[0].eval_steps
            xs = [np.mean([r.elapsed_at.get(s, 0.0) / 60 for r in runs]) if xkind == "time" else s for s in steps]
            mean = [np.mean([r.correct[i].mean() for r in runs]) for i in range(len(steps))]
            band = [stats.percentile_interval(stats.two_level_bootstrap(np.stack([r.correct[i] for r in runs]),
                                                                         n_boot // 4, rng)) for i in range(len(steps))]
            line, = ax.plot(xs, mean, marker="o", label=f"{est} ({len(runs)} seeds)")
            ax.fill_between(xs, [b[0] for b in band], [b[1] for b in band], alpha=0.15, color=line.get_color())
            for r in runs:
                rx = [r.elapsed_at.get(s, 0.0) / 60 for s in r.eval_steps] if xkind == "time" else r.eval_steps
                ax.plot(rx, r.correct.mean(axis=1), lw=0.7, ls="--", alpha=0.6, color=line.get_color())
        ax.set(xlabel="training step" if xkind == "step" else "wall clock (min, mean over seeds)",
               ylabel="greedy eval accuracy",
               title="mean over seeds, 95% bootstrap band (seeds x problems), seeds dashed")
        ax.title.set_fontsize("medium")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
        path = out_dir / f"ablation_accuracy_vs_{xkind}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


# the CPU's generation and vector ISA (a VM may name Zen 3 and Zen 4 alike) and its native-bf16 flags;
# reports show them only where a run recorded them (older runs did not), so the reports of older runs
# regenerate unchanged
CPU_DETAIL_KEYS = ("provenance.machine.cpu_family_model", "provenance.machine.cpu_capability",
                   "provenance.machine.cpu_bf16")


def _provenance_lines(records: list[RunRecord]) -> list[str]:
    keys = ["provenance.git.commit", "provenance.git.dirty", "provenance.version.torch",
            "provenance.version.transformers", "provenance.machine.cpu", *CPU_DETAIL_KEYS, "provenance.machine.cores",
            "provenance.data.eval.problems_sha256", "provenance.model.source_sha256"]
    lines = []
    for k in keys:
        if k in CPU_DETAIL_KEYS and not any(k in r.params for r in records):
            continue
        vals = sorted({r.params.get(k, "<not recorded>") for r in records})
        flag = "" if len(vals) == 1 else " **(differs between runs)**"
        lines.append(f"- `{k[len('provenance.'):]}`: {', '.join(f'`{v}`' for v in vals)}{flag}")
    return lines


def write_report(result: dict, records: list[RunRecord], out: Path, meta: dict) -> Path:
    """``<out>/ABLATION.md``."""
    out.mkdir(parents=True, exist_ok=True)
    base = result["baseline"]
    pw = result["power"]
    r0 = records[0].params
    L = ["# Estimator ablation on `arith`", ""]
    L += [f"Sweep `{meta['sweep']}` in `{meta['uri']}`: {len(records)} finished runs. Regenerate this file with",
          "", "```bash", meta["regen"], "```", ""]
    if meta.get("command"):
        L += ["The runs came from", "", "```bash", meta["command"], "```", ""]
    L += ["Budget per run: " + ", ".join(f"{k} {r0.get(k, '?')}" for k in (
        "train.steps", "train.prompts_per_step", "group_size", "rollout.temperature", "rollout.max_new_tokens",
        "train.lr", "beta", "loss_agg.name", "policy_loss.name", "eval.size", "eval.every")) +
          f"; evals at steps {records[0].eval_steps}. One standard error of a single run's final accuracy on "
          f"{pw['problems']} problems: {_pct(pw['se_one_run'])} points.", ""]
    L += ["## Accuracy", "",
          "Means over seeds; 95% intervals from a bootstrap over seeds and eval problems (two levels; "
          "percentile intervals, inside [0, 1]). AUC = area under the greedy eval accuracy vs step, "
          "divided by the step span (the mean accuracy over training). Per-seed values in brackets.", "",
          "| estimator | seeds | initial | final accuracy (95% CI) | per seed | AUC (95% CI) | per seed |",
          "|---|---|---|---|---|---|---|"]
    for r in result["summary"]:
        L.append(f"| {r['estimator']} | {r['seeds']} | {_pct(r['initial'])} | {_pct(r['final'])} "
                 f"[{_pct(r['final_lo'])}, {_pct(r['final_hi'])}] | {', '.join(_pct(v) for v in r['final_seeds'])} | "
                 f"{_pct(r['auc'])} [{_pct(r['auc_lo'])}, {_pct(r['auc_hi'])}] | "
                 f"{', '.join(_pct(v) for v in r['auc_seeds'])} |")
    L += ["", f"## Paired differences vs {base}", "",
          f"Estimator minus {base}, same seed and same problems (points); bootstrap 95% CI and two-sided "
          "bootstrap p over seeds and problems; paired t-test p over the per-seed means (secondary).", "",
          "| estimator | metric | pairs | difference (95% CI) | p (bootstrap) | p (t, seeds) | sd over seeds |",
          "|---|---|---|---|---|---|---|"]
    for p in result["paired"]:
        L.append(f"| {p['estimator']} | {p['metric']} | {p['pairs']} | {100 * p['diff']:+.1f} "
                 f"[{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}] | {p['p_boot']:.2f} | "
                 f"{'n/a' if math.isnan(p['p_t']) else format(p['p_t'], '.2f')} | "
                 f"{100 * p['sd_seed']:.1f} |")
    L += ["", "## Cost", "", "| estimator | step time s (mean; min-max over seeds) | peak memory GiB |", "|---|---|---|"]
    for r in result["summary"]:
        L.append(f"| {r['estimator']} | {r['step_time_s']:.1f} ({r['step_time_min']:.1f}-{r['step_time_max']:.1f}) | "
                 f"{r['peak_mem_gib']:.2f} |")
    L += ["", "## Plots", "", "![accuracy vs step](plots/ablation_accuracy_vs_step.png)", "",
          "![accuracy vs wall clock](plots/ablation_accuracy_vs_time.png)", ""]
    L += ["## Conclusion", ""] + conclusion(result) + [""]
    prec = meta.get("precision")
    if prec:
        L += ["## bf16 autocast vs fp32 on this machine", ""] + prec + [""]
    for note in meta.get("notes") or []:
        L += [note, ""]
    L += ["## Provenance of the runs", ""] + _provenance_lines(records) + [""]
    path = out / "ABLATION.md"
    path.write_text("\n".join(L))
    return path


def conclusion(result: dict) -> list[str]:
    """Plain-language reading of the intervals, written from the numbers."""
    base, pw = result["baseline"], result["power"]
    lines = []
    finals = [p for p in result["paired"] if p["metric"] == "final"]
    separated = [p for p in finals if p["lo"] > 0 or p["hi"] < 0]
    if not finals:
        return [f"No estimator shares seeds with {base}: no paired comparison."]
    if not separated:
        lines.append(f"- **Not distinguishable at this budget.** Every paired 95% interval of the final-accuracy "
                     f"difference to {base} contains 0 (" + "; ".join(
                         f"{p['estimator']} {100 * p['diff']:+.1f} [{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}]"
                         for p in finals) + " points).")
    else:
        for p in separated:
            word = "above" if p["lo"] > 0 else "below"
            lines.append(f"- {p['estimator']} ends {word} {base}: {100 * p['diff']:+.1f} points "
                         f"[{100 * p['lo']:+.1f}, {100 * p['hi']:+.1f}] (with {p['pairs']} seeds; a 3-seed interval "
                         "is itself uncertain: confirm with more seeds).")
    gains = [r for r in result["summary"] if r["final_lo"] > r["initial"]]
    lines.append(f"- Learning over the run (final accuracy interval above the initial accuracy): "
                 f"{', '.join(r['estimator'] for r in gains) or 'no estimator'}.")
    if pw["seeds_needed"] is not None:
        lines.append(f"- Power: the per-seed paired differences of final accuracy spread by {100 * pw['sd_pooled']:.1f} "
                     f"points (pooled sd over the estimators compared; it includes the eval-problem noise of the "
                     f"fixed {pw['problems']}-problem set that pairing does not cancel). With {pw['seeds']} seeds a "
                     f"two-sided 5% paired t-test has 80% power only for differences of about "
                     f"**{100 * pw['mde']:.1f} points**; a 5-point difference needs **{pw['seeds_needed']} seeds** "
                     "per estimator (exact, noncentral t). This spread was measured between estimators whose "
                     "differences here are small; a variant that changes the training more may spread more.")
    return lines


def precision_lines(path: Path) -> list[str] | None:
    """The bf16 section from ``results/precision_cpu.json`` (written by benchmarks.precision_step)."""
    if not path.exists():
        return None
    d = json.loads(path.read_text())
    lines = [f"Measured {d['date']} on {d['cpu']} ({d['cores']} cores) by `{d['command']}`:", "",
             f"- startup probe (MLP forward + backward): fp32 {d['probe']['fp32_gflops']:.0f} GFLOP/s, "
             f"bf16 autocast {d['probe']['bf16_gflops']:.0f} GFLOP/s ({d['probe']['speedup']:.2f}x); "
             f"`train.precision=auto` picks **{d['auto_choice']}** here;",
             f"- a full `preset=arith_cpu` training step (mean of steps after the first): fp32 "
             f"{d['fp32_step_s']:.1f} s, bf16-autocast {d['bf16_step_s']:.1f} s "
             f"(speed-up {d['fp32_step_s'] / d['bf16_step_s']:.2f}x: "
             + ("bf16 is faster)." if d['fp32_step_s'] > d['bf16_step_s'] else
                f"bf16 takes {d['bf16_step_s'] / d['fp32_step_s']:.1f}x as long).")]
    lines.append(d.get("verdict", ""))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m analysis.ablation", description=__doc__.splitlines()[0])
    ap.add_argument("--tracking-uri", default="sqlite:///results/ablation/mlflow.db")
    ap.add_argument("--sweep", required=True)
    ap.add_argument("--experiment", default="grpo-harness")
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--out", default="reports", help="output folder (default: reports/, git-ignored; "
                    "--out results regenerates the committed report)")
    ap.add_argument("--boot", type=int, default=2000)

    a = ap.parse_args(argv)
    uri = a.tracking_uri
    if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
        if not Path(uri[10:]).exists():
            print(f"error: --tracking-uri {uri}: no such file", flush=True)
            return 2
    try:
        records = load_sweep(uri, a.sweep, a.experiment)
    except ValueError as e:
        print(f"error: {e}", flush=True)
        return 2
    result = analyse(records, a.baseline, a.boot)
    out = Path(a.out)
    plot(records, out / "plots", a.boot)
    regen = f"python -m analysis.ablation --tracking-uri {uri} --sweep {a.sweep} --out {a.out}"
    # beside a sqlite store: command.txt (what produced the runs) and notes.md (paragraphs for the report)
    side = Path(uri[len("sqlite:///"):]).parent if uri.startswith("sqlite:///") else None
    command = (side / "command.txt").read_text().strip() if side and (side / "command.txt").exists() else None
    notes = (side / "notes.md").read_text().strip().split("\n\n") if side and (side / "notes.md").exists() else []
    meta = {"sweep": a.sweep, "uri": uri, "regen": regen, "command": command,
            "precision": precision_lines(out / "precision_cpu.json"), "notes": notes}
    path = write_report(result, records, out, meta)
    (out / "ablation.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {path} ({len(records)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
