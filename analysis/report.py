"""One-command report: collect -> compare -> plots -> ``<out>/REPORT.md``.

Example::

    python -m analysis.report --experiment grpo-harness --sweep my-sweep --out results \\
        --a estimator=grpo --b estimator=ppo

Writes (under ``--out``): ``runs.csv``, ``history.csv``, ``skipped_runs.csv`` (collect),
``per_run.csv``, ``summary.csv``, ``paired.csv`` (compare; paired only with ``--a``/``--b``),
``plots/*.png`` (plots) and ``REPORT.md`` with the tables and image links.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import math
import shlex
import sys
from pathlib import Path

import pandas as pd

from analysis import DEFAULT_BY
from analysis.collect import Collection, add_query_args, collect_runs, parse_tags, stale_hours, resolve_tracking_uri, \
    save_collection
from analysis.compare import METRICS, parse_variant, run_compare, split_cols
from analysis.mdtable import format_cell, markdown_table
from analysis.plots import PLOT_FILES, make_plots

METRIC_TITLES = {
    "final_eval_accuracy": "final eval acc",
    "reward_auc": "reward AUC",
    "peak_mem_gib": "peak mem (GiB)",
    "step_time_s": "step time (s)",
    "wall_time_s": "wall time (s)",
    "final_pass_at_k": "final pass@k",
}


def _ci_text(mean: float, lo: float, hi: float, fmt: str = ".3g") -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return ""
    if lo is None or hi is None or math.isnan(lo) or math.isnan(hi):
        return format(mean, fmt)
    return f"{format(mean, fmt)} [{format(lo, fmt)}, {format(hi, fmt)}]"


def summary_wide(summary: pd.DataFrame) -> pd.DataFrame:
    """Pivot the long summary to one row per variant: ``n`` and ``mean [ci_lo, ci_hi]`` per metric."""
    if summary.empty:
        return pd.DataFrame()
    by = [c for c in summary.columns if c not in ("metric", "n", "mean", "std", "ci_lo", "ci_hi")]
    rows = []
    groups = summary.groupby(by, dropna=False, sort=True) if by else [((), summary)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        row = {col: format_cell(v) for col, v in zip(by, key)}
        row["n"] = int(g["n"].max())
        for _, r in g.iterrows():
            row[METRIC_TITLES.get(r["metric"], r["metric"])] = _ci_text(r["mean"], r["ci_lo"], r["ci_hi"])
        rows.append(row)
    return pd.DataFrame(rows)


def _runs_table(per_run: pd.DataFrame) -> pd.DataFrame:
    cols = ["run_id", "run_name", "estimator", "group_size", "seed", "task", "status",
            *[m for m in METRICS if m in per_run.columns and per_run[m].notna().any()]]
    table = per_run[[c for c in cols if c in per_run.columns]].copy()
    table["run_id"] = table["run_id"].astype(str).str[:8]
    sort = [c for c in ("estimator", "group_size", "seed") if c in table.columns]
    return table.sort_values(sort, kind="stable") if sort else table


# params that legitimately differ between seeds of one configuration
_PER_RUN_PARAMS = {"params.seed", "params.tracking.run_name", "params.tracking.sweep", "params.output_dir",
                   "params.checkpoint.dir", "params.resume", "params.tracking.uri"}


def mixed_params(runs: pd.DataFrame, by: list[str]) -> list[str]:
    """Param columns whose value varies inside some group of ``by`` (besides the seed)."""
    cols = [c for c in runs.columns if c.startswith("params.") and c not in _PER_RUN_PARAMS
            and not c.startswith("params.provenance.")]
    by = [b for b in by if b in runs.columns]
    if runs.empty or not by or not cols:
        return []
    varying = runs.groupby(by, dropna=False)[cols].nunique(dropna=False).max()
    return sorted(c[len("params."):] for c, n in varying.items() if n > 1)


_PROVENANCE_PER_MACHINE = {"params.provenance.machine.hostname", "params.provenance.machine.torch_threads"}


def provenance_differences(runs: pd.DataFrame) -> pd.DataFrame:
    """``provenance.*`` params (versions, machine, commit, dirty tree, data and weight digests) whose
    value is not the same in every run compared: ``key``, ``values`` (value: number of runs)."""
    cols = [c for c in runs.columns if c.startswith("params.provenance.") and c not in _PROVENANCE_PER_MACHINE]
    rows = []
    for c in sorted(cols):
        counts = runs[c].fillna("<not recorded>").astype(str).value_counts()
        if len(counts) > 1:
            rows.append({"key": c[len("params.provenance."):],
                         "values": "; ".join(f"{v[:16]}{'...' if len(v) > 16 else ''}: {n}" for v, n in counts.items())})
    return pd.DataFrame(rows, columns=["key", "values"])


MIN_RUNS_FOR_INTERVAL = 3


def budget_warnings(per_run: pd.DataFrame, history: pd.DataFrame, by) -> list[str]:
    """Warnings that a comparison cannot say much at this budget.

    * an arm (one value of the ``by`` columns) with fewer than 3 runs: a t-interval over 1 seed does
      not exist and over 2 has 1 degree of freedom;
    * two runs of different arms whose ``train/reward_mean`` histories are identical: the arms drew
      the same rewards (a few steps at a small lr barely move the policy, and seeded sampling then
      draws the same completions), so the comparison has no signal at this budget.
    """
    if per_run.empty:
        return []
    by = [c for c in by if c in per_run.columns]
    out = []
    if by:
        counts = per_run.groupby(by, dropna=False).size()
        for key, n in counts.items():
            if n < MIN_RUNS_FOR_INTERVAL:
                label = key if isinstance(key, tuple) else (key,)
                out.append(f"arm `{' '.join(str(v) for v in label)}` has {n} run{'s' if n != 1 else ''}: no interval "
                           f"possible: run more seeds (at least {MIN_RUNS_FOR_INTERVAL}).")
    if not history.empty and by:
        rew = history[history["key"] == "train/reward_mean"].sort_values(["step", "timestamp"])
        seqs = {rid: tuple(g.drop_duplicates("step", keep="last")["value"].round(12)) for rid, g in rew.groupby("run_id")}
        arm = {r.run_id: tuple(str(getattr(r, c)) for c in by) for r in per_run.itertuples()}
        seen: dict[tuple, str] = {}
        for rid in per_run["run_id"]:
            s = seqs.get(rid)
            if not s or len(s) < 2:
                continue
            other = seen.get(s)
            if other is not None and arm.get(other) != arm.get(rid):
                out.append(f"runs {other[:8]} (`{' '.join(arm[other])}`) and {rid[:8]} (`{' '.join(arm[rid])}`) drew "
                           f"identical rewards at every step {list(s)}: no signal at this budget.")
            seen.setdefault(s, rid)
    return out


def write_report(out: str | Path, coll: Collection, frames: dict[str, pd.DataFrame],
                 plots: dict[str, Path], meta: dict | None = None) -> Path:
    """Write ``<out>/REPORT.md`` from the collection, compare frames and plot paths."""
    out = Path(out)
    meta = meta or {}
    lines = ["# grpo-harness report", ""]
    lines.append(f"Generated {_dt.datetime.now().isoformat(timespec='seconds')} by "
                 f"`{meta.get('command', 'python -m analysis.report')}`.")
    lines.append("")
    for key in ("tracking_uri", "experiments", "sweep", "tags", "group_by"):
        if meta.get(key):
            lines.append(f"- **{key}**: {meta[key]}")
    lines += [f"- **runs used**: {len(coll.runs)}", f"- **runs skipped** (not FINISHED): {len(coll.skipped)}", ""]
    lines += _summary_lines(coll, frames, meta.get("group_by_cols") or ["estimator", "group_size"])
    lines += _paired_lines(frames.get("paired"))
    lines += _provenance_lines(coll.runs)
    lines += _runs_lines(coll, frames.get("per_run", pd.DataFrame()))
    lines += _figure_lines(out, plots)
    lines += ["## Files", "",
              "- `runs.csv` one row per run (tags, params, last metric values); `history.csv` every "
              "metric point (run_id, key, step, value, timestamp); `skipped_runs.csv` runs not used.",
              "- `per_run.csv` derived per-run metrics; `summary.csv` per-variant statistics (long); "
              "`paired.csv` paired comparison (when requested).", ""]
    path = out / "REPORT.md"
    path.write_text("\n".join(lines))
    return path


def _summary_lines(coll: Collection, frames: dict[str, pd.DataFrame], by_cols: list[str]) -> list[str]:
    """The summary over seeds (mean and t interval per variant) and the budget and mixed-config warnings."""
    lines = ["## Summary over seeds", "",
             "Mean and 95% Student-t confidence interval over seeds (blank CI when n = 1). "
             "Reward AUC is the trapezoid area under `train/reward_mean` vs step divided by the "
             "step span.", ""]
    wide = summary_wide(frames.get("summary", pd.DataFrame()))
    lines.append(markdown_table(wide) if not wide.empty else "_No finished runs with metrics._\n")
    for w in budget_warnings(frames.get("per_run", pd.DataFrame()), coll.history, by_cols):
        lines += ["", f"**Warning:** {w}"]
    mixed = mixed_params(coll.runs, by_cols)
    if mixed:
        lines += ["", "**Warning:** within a group, runs differ in more than the seed, so the CI mixes "
                  f"configurations: {', '.join(f'`{m}`' for m in mixed)}. Filter with `--sweep`/`--tag` "
                  "or add the columns to `--by`.", ""]
    return lines


def _paired_lines(paired: pd.DataFrame | None) -> list[str]:
    """The paired comparison A - B (none when it was not asked for)."""
    if paired is None or paired.empty:
        return []
    cols = ["metric", "n_pairs", "mean_a", "mean_b", "mean_diff", "boot_lo", "boot_hi", "welch_p"]
    return ["## Paired comparison", "",
            f"A = `{paired['a'].iloc[0]}`, B = `{paired['b'].iloc[0]}`; differences A - B "
            f"paired on `{paired['pair_on'].iloc[0] or '(nothing)'}`; 95% percentile bootstrap CI "
            "of the mean paired difference; Welch's t-test on the unpaired runs (secondary).", "",
            markdown_table(paired[cols])]


def _provenance_lines(runs: pd.DataFrame) -> list[str]:
    """Whether the runs compared share what produced them (versions, machine, commit, data, weights)."""
    lines = ["## Provenance", ""]
    prov = provenance_differences(runs)
    if not any(c.startswith("params.provenance.") for c in runs.columns):
        return lines + ["_The runs record no provenance (they predate its logging)._", ""]
    if prov.empty:
        return lines + ["Every run compared has the same package versions, machine, commit, tree state, data "
                        "and initial-weight digests.", ""]
    return lines + ["The runs compared differ in what produced them (value: runs):", "", markdown_table(prov), ""]


def _runs_lines(coll: Collection, per_run: pd.DataFrame) -> list[str]:
    """The runs used, then the runs skipped."""
    lines = ["## Runs", ""]
    lines.append(markdown_table(_runs_table(per_run)) if not per_run.empty else "_No runs._\n")
    if len(coll.skipped):
        lines += ["### Skipped runs", ""]
        skipped = coll.skipped.copy()
        skipped["run_id"] = skipped["run_id"].astype(str).str[:8]
        lines.append(markdown_table(skipped))
    return lines


def _figure_lines(out: Path, plots: dict[str, Path]) -> list[str]:
    """The figures drawn, linked relative to ``out``, and the ones skipped for want of data."""
    lines = ["## Figures", ""]
    for name in PLOT_FILES:
        if name in plots:
            rel = Path(plots[name]).resolve().relative_to(out.resolve()).as_posix()
            lines += [f"### {name[:-4].replace('_', ' ')}", "", f"![{name[:-4]}]({rel})", ""]
    missing = [n for n in PLOT_FILES if n not in plots]
    if missing:
        lines += ["Skipped (no data): " + ", ".join(f"`{m}`" for m in missing), ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: collect -> compare -> plots -> REPORT.md."""
    parser = argparse.ArgumentParser(prog="python -m analysis.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_query_args(parser)
    parser.add_argument("--by", nargs="+", default=list(DEFAULT_BY), help="columns defining a variant")
    parser.add_argument("--a", default=None, help="variant A for the paired test, KEY=VALUE[,KEY=VALUE]")
    parser.add_argument("--b", default=None, help="variant B for the paired test")
    parser.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed")
    parser.add_argument("--parquet", action="store_true", help="also write parquet copies of the frames")
    args = parser.parse_args(argv)
    if bool(args.a) != bool(args.b):
        parser.error("--a and --b go together")
    by = split_cols(args.by)
    tags = parse_tags(args.tag)
    coll = collect_runs(args.tracking_uri, args.experiment, tags, args.sweep, args.include_unfinished,
                        stale_after_hours=stale_hours(args), keep_duplicates=args.keep_duplicates)
    save_collection(coll, args.out, args.parquet)
    frames = run_compare(coll.runs, coll.history, args.out, by,
                         parse_variant(args.a) if args.a else None, parse_variant(args.b) if args.b else None,
                         n_boot=args.n_boot, seed=args.seed, verbose=False)
    plots = make_plots(coll.runs, coll.history, frames["summary"], args.out, by)
    meta = {"command": "python -m analysis.report " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                        else sys.argv[1:])),
            "tracking_uri": resolve_tracking_uri(args.tracking_uri),
            "experiments": ", ".join(args.experiment or ["grpo-harness"]), "sweep": args.sweep,
            "tags": ", ".join(f"{k}={v}" for k, v in tags.items()), "group_by": ", ".join(by), "group_by_cols": list(by)}
    path = write_report(args.out, coll, frames, plots, meta)
    print(f"[report] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
