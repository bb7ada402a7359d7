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

* **The noise-cost frontier.** A design (steps, prompts a step, eval size) buys power per machine-hour
  in proportion to ``1 / (sd^2 x seconds a seed)``: the seeds a paired test needs at a fixed power
  scale as ``sd^2``. :func:`frontier` tabulates it for designs whose paired sd was measured on one pair of
  arms (pilots evaluated every few steps: with ``train.lr_schedule=constant`` step ``k`` of a longer run
  is the ``k``-step run, :func:`at_step`) and whose eval size changes only the eval share of the
  variance (:func:`sd_at_size`); each design's sd is the reference sd (the study's largest measured)
  times its ratio to the pilots' sd at the reference design.

Run: ``python -m analysis.noise`` (prints markdown tables; reads ``results/ablation`` and every
``studies/*.yaml`` store that has runs); ``python -m analysis.noise --frontier`` (the frontier of the
design card grid v2 from ``results/pilots/noise_cost``, the grid's store and ``results/study_cost.json``).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient

from analysis import stats
from analysis.ablation import RunRecord, auc, load_sweep
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


def at_step(rec: RunRecord, step: int) -> RunRecord:
    """``rec`` as the run that stops at ``step``: its evals up to and including ``step``. With
    ``train.lr_schedule=constant`` (no schedule over ``train.steps``) step ``k`` of a longer run is the
    ``k``-step run: the same weights, sampled with the same seeded streams.

    Raises:
        ValueError: ``rec`` has no eval at ``step``.
    """
    if step not in rec.eval_steps:
        raise ValueError(f"run {rec.run_id} has no eval at step {step}: its evals are at {rec.eval_steps}")
    k = rec.eval_steps.index(step) + 1
    return dataclasses.replace(rec, eval_steps=rec.eval_steps[:k], correct=rec.correct[:k])


def sd_at_size(table: dict, problems: int) -> float:
    """The paired sd of the final difference at an eval of ``problems`` problems, from a
    :func:`paired_table` measured at ``table["problems"]``: ``sqrt(train_sd^2 + eval_sd^2 n / m)``
    (the eval's sampling variance scales as ``1 / m``; the training noise does not depend on the eval)."""
    return math.sqrt(table["train_sd"] ** 2 + table["eval_sd"] ** 2 * table["problems"] / problems)


@dataclasses.dataclass(frozen=True)
class Design:
    """One study design: ``steps`` training steps of ``prompts`` prompts, a final greedy eval of
    ``problems`` problems."""

    steps: int
    prompts: int
    problems: int

    def label(self) -> str:
        return f"{self.steps} steps x {self.prompts} prompts, {self.problems} problems"


@dataclasses.dataclass(frozen=True)
class SeedCost:
    """The seconds of one run (two one-thread jobs side by side, as a study runs): ``overhead_s``
    (process start, model load, the replayed step-0 eval, tracking), ``eval_s_per_problem`` (the
    final greedy eval), ``step_s`` (``{prompts: s}``: a step of the control arm at that many prompts a
    step) and ``arm_ratio`` (``{arm: a step of the arm / a step of the control}``)."""

    overhead_s: float
    eval_s_per_problem: float
    step_s: dict
    arm_ratio: dict

    def seed_hours(self, d: Design, jobs: int = 2) -> float:
        """Machine-hours of one seed of every arm at design ``d`` (``jobs`` runs side by side).

        Raises:
            KeyError: no measured step time at ``d.prompts`` prompts a step.
        """
        run_s = sum(self.overhead_s + d.steps * self.step_s[d.prompts] * r + d.problems * self.eval_s_per_problem
                    for r in self.arm_ratio.values())
        return run_s / jobs / 3600


def frontier(pilot_sd: dict, reference: Design, reference_sd: float, cost: SeedCost, test: dict) -> list[dict]:
    """Power per machine-hour of each design, relative to ``reference``.

    Args:
        pilot_sd: ``{Design: paired sd}`` measured on one pair of arms (the pilots), ``reference`` among them.
        reference_sd: the study's paired sd at ``reference`` (its largest measured, accuracy 0-1).
        cost: the seconds of a seed's runs.
        test: the test each comparison decides (already corrected for the family).
    Returns:
        One row a design: ``design``, ``sd`` (``reference_sd`` x the pilot's ratio to ``reference``),
        ``seed_hours``, ``seeds`` (fixed design, 80% power at ``sd``: :func:`analysis.stats.seeds_for_power`),
        ``hours`` (``seeds x seed_hours``) and ``gain`` (``sd_ref^2 seed_hours_ref / (sd^2 seed_hours)``).
    Raises:
        KeyError: ``reference`` not in ``pilot_sd``.
    """
    base = pilot_sd[reference]
    ref_cost = reference_sd ** 2 * cost.seed_hours(reference)
    rows = []
    for d, s in pilot_sd.items():
        sd = reference_sd * s / base
        hours = cost.seed_hours(d)
        seeds = stats.seeds_for_power(test, sd)
        rows.append({"design": d, "pilot_sd": s, "sd": sd, "seed_hours": hours, "seeds": seeds, "hours": seeds * hours,
                     "gain": ref_cost / (sd ** 2 * hours)})
    return rows


def load_pilots(uri: str, sweeps: dict) -> dict[str, list[RunRecord]]:
    """``{sweep tag: its finished runs}`` of the pilots' MLflow store ``uri`` (``sweeps``: ``{sweep tag:
    prompts a step}``), read once for :func:`pilot_tables` and :func:`measured_cost`.

    Raises:
        ValueError: a sweep without finished runs (:func:`analysis.ablation.load_sweep`).
    """
    return {sweep: load_sweep(uri, sweep) for sweep in sweeps}


def pilot_tables(runs: dict, sweeps: dict, control: str, treatment: str, by: str = "group_size",
                 problems: int | None = None) -> dict:
    """``{Design: paired_table}`` of pilot multiruns evaluated every few steps: each sweep's runs
    split into the two arms by the param ``by`` (``control`` / ``treatment`` its values), one
    design per eval step after 0 (:func:`at_step`).

    Args:
        runs: :func:`load_pilots`; sweeps: ``{sweep tag: prompts a step}``.
        problems: the designs' eval size (default: the runs').
    Raises:
        ValueError: a sweep without finished runs of both arms at 2 or more seeds (:func:`paired_table`).
    """
    out = {}
    for sweep, prompts in sweeps.items():
        arms: dict = {}
        for r in runs[sweep]:
            arms.setdefault(r.params[by], {})[r.seed] = r
        ctl, trt = arms.get(control, {}), arms.get(treatment, {})
        steps = sorted({s for r in [*ctl.values(), *trt.values()] for s in r.eval_steps if s > 0})
        for k in steps:
            t = paired_table({s: at_step(r, k) for s, r in ctl.items()}, {s: at_step(r, k) for s, r in trt.items()})
            out[Design(k, prompts, problems or t["problems"])] = t
    return out


def measured_cost(uri: str, runs: dict, sweeps: dict, control: str, study_cost: Path, grid: dict,
                  by: str = "group_size") -> SeedCost:
    """The :class:`SeedCost` of a study's arms: the control's step at each prompt count and the eval's
    seconds a problem from the pilots (``uri`` their store, ``runs`` and ``sweeps`` as in
    :func:`pilot_tables`: the mean
    ``time/step_s`` of the control's runs, the mean ``time/eval_s`` of their evals after step 0), the
    overhead from ``study_cost`` (``benchmarks.study_cost --paths``: the ``new_fp32`` path's process
    start, model load, engine build, replayed step-0 eval and tracking), and each arm's step relative
    to the control from ``grid`` (``{"control": arm, "records": {arm: {seed: RunRecord}}}``, a study
    whose arms ran side by side on one machine: the ratio of the arms' mean step times).

    Raises:
        KeyError: ``study_cost`` has no ``new_fp32`` path.
    """
    client = MlflowClient(uri)
    step_s, eval_s = {}, []
    for sweep, prompts in sweeps.items():
        recs = [r for r in runs[sweep] if r.params[by] == control]
        step_s[prompts] = float(np.mean([r.step_time_s for r in recs]))
        eval_s += [m.value / len(r.correct[0]) for r in recs
                   for m in client.get_metric_history(r.run_id, "time/eval_s") if m.step > 0]
    parts = json.loads(study_cost.read_text())["new_fp32"]["mean"]
    overhead = sum(parts[k] for k in ("process start", "model load", "engine build", "eval (step 0)",
                                      "tracking and the rest"))
    ctl_arm = grid["control"]
    mean_step = {a: float(np.mean([r.step_time_s for r in recs.values()])) for a, recs in grid["records"].items()}
    ratio = {a: v / mean_step[ctl_arm] for a, v in mean_step.items()}
    return SeedCost(overhead, float(np.mean(eval_s)), step_s, ratio)


def frontier_table(rows: list[dict], reference: Design) -> list[str]:
    """Markdown rows of :func:`frontier` (sd in points)."""
    lines = ["| design | pilot paired sd | projected sd | machine-hours a seed (8 arms) | seeds for 80% power "
             "| machine-hours to 80% power | power per machine-hour vs the grid's |", "|" + "---|" * 7]
    for r in sorted(rows, key=lambda r: -r["gain"]):
        name = r["design"].label() + (" (the grid's)" if r["design"] == reference else "")
        lines.append(f"| {name} | {r['pilot_sd'] * 100:.2f} | {r['sd'] * 100:.2f} | {r['seed_hours']:.2f} | "
                     f"{r['seeds']} | {r['hours']:.1f} | {r['gain']:.2f}x |")
    return lines


PILOTS = Path("results/pilots/noise_cost")
PILOT_SWEEPS = {"noise_cost.p4": 4, "noise_cost.p8": 8}  # sweep tag: prompts a step
EVAL_SIZES = (125, 500, 1000)


def grid_frontier(study: Path = Path("studies/design_card_grid.yaml"), pilots: Path = PILOTS,
                  study_cost: Path = Path("results/study_cost.json")) -> tuple[list[str], dict]:
    """The frontier of the design card grid's next design (:func:`frontier`): the pilots' designs at the
    grid's eval size, and the grid's design at other eval sizes (its own noise split: the comparison
    with the largest sd); the reference sd is that comparison's. Returns the markdown rows and
    ``{"reference_arm", "reference_sd", "cost"}``."""
    spec = load_study(study)
    recs = load_records(spec)
    ctl = spec["control"]
    tables = {a: paired_table(recs[ctl], recs[a]) for a in spec["comparisons"]}
    ref_arm = max(tables, key=lambda a: tables[a]["final"]["sd"])
    grid_t = tables[ref_arm]
    uri = f"sqlite:///{pilots / 'mlflow.db'}"
    runs = load_pilots(uri, PILOT_SWEEPS)
    pilot = pilot_tables(runs, PILOT_SWEEPS, control="8", treatment="4")
    reference = Design(spec["steps"], 4, spec["eval_size"])
    sds = {d: t["final"]["sd"] for d, t in pilot.items()}
    for m in EVAL_SIZES:  # the reference design at other eval sizes, scaled by the grid's own split
        sds[Design(reference.steps, reference.prompts, m)] = sds[reference] * sd_at_size(grid_t, m) / sd_at_size(
            grid_t, reference.problems)
    cost = measured_cost(uri, runs, PILOT_SWEEPS, "8", study_cost, {"control": ctl, "records": recs})
    test = stats.corrected_test(spec["test"], len(spec["comparisons"]))
    rows = frontier(sds, reference, grid_t["final"]["sd"], cost, test)
    return frontier_table(rows, reference), {"reference_arm": ref_arm, "reference_sd": grid_t["final"]["sd"],
                                             "cost": cost, "pilot": pilot}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frontier", action="store_true", help="the design card grid's noise-cost frontier")
    args = ap.parse_args(argv)
    if args.frontier:
        lines, info = grid_frontier()
        print(f"reference: {info['reference_arm']} - control, sd {info['reference_sd'] * 100:.2f} points; {info['cost']}")
        print("\n".join(table({f"pilot {d.label()}": t for d, t in info["pilot"].items()})))
        print()
        print("\n".join(lines))
        return 0
    print("\n".join(table({**ablation_pairs(), **study_pairs()})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
