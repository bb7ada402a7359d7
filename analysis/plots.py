"""Figures for grpo-harness runs, written as PNGs to ``<results>/plots/``.

- ``eval_accuracy_vs_step.png`` / ``eval_accuracy_vs_time.png``: greedy eval accuracy vs
  training step and vs wall-clock ``time/elapsed_s`` (mean over seeds; a 95% percentile-bootstrap
  band over seeds with 3 or more, which stays inside the data's range; each seed drawn with fewer).
- ``train_reward_vs_step.png`` / ``train_reward_vs_time.png``: same for ``train/reward_mean``.
- ``final_accuracy_vs_group_size.png``: final eval accuracy vs group size, one line per estimator.
- ``peak_memory.png`` / ``step_time.png``: bars per estimator (grouped by group size).
- ``kl_vs_reward.png``: ``train/kl`` vs ``train/reward_mean`` (per-step points, per-variant
  mean trajectory).
- ``completion_length.png``: ``train/completion_len_mean`` vs step.

A figure whose data is missing is skipped with a message. Reads ``runs.csv``/``history.csv``
from ``--results`` (written by ``python -m analysis.collect``).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from analysis import DEFAULT_BY, DEFAULT_OUT  # noqa: E402
from analysis.collect import load_collection  # noqa: E402
from analysis.compare import _norm, per_run_metrics, split_cols, summarize, variant_label  # noqa: E402
from analysis.stats import paired_bootstrap_ci  # noqa: E402

CURVES = {  # file stem -> (metric key, y label)
    "eval_accuracy": ("eval/accuracy", "eval accuracy (greedy pass@1)"),
    "train_reward": ("train/reward_mean", "train reward (mean)"),
}
TIME_KEY = "time/elapsed_s"
PLOT_FILES = [f"{stem}_vs_{x}.png" for stem in CURVES for x in ("step", "time")] + [
    "final_accuracy_vs_group_size.png", "peak_memory.png", "step_time.png", "kl_vs_reward.png",
    "completion_length.png"]


def _with_variant(frame: pd.DataFrame, runs: pd.DataFrame, by) -> pd.DataFrame:
    """Attach a ``variant`` label column (from ``by`` columns of ``runs``) to ``frame``."""
    by = [c for c in by if c in runs.columns]
    labels = runs.set_index("run_id").apply(lambda r: variant_label(r, by) or "all", axis=1) \
        if len(runs) else pd.Series(dtype=str)
    out = frame.copy()
    out["variant"] = out["run_id"].map(labels)
    return out.dropna(subset=["variant"])


def bootstrap_band(values, n_boot: int = 2000, conf: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the mean over runs, NaN with fewer than 3 runs.

    Unlike a Student-t interval it stays inside the range of the data (an accuracy band never
    leaves [0, 1]); with 1-2 runs no interval is drawn, the runs are shown individually.
    """
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if len(v) < 3:
        return math.nan, math.nan
    return paired_bootstrap_ci(v, n_boot=n_boot, conf=conf, seed=seed)


def _aggregate(points: pd.DataFrame, x: str) -> pd.DataFrame:
    """Mean and bootstrap band (:func:`bootstrap_band`) of ``value`` over runs at each (variant, x);
    the per-run points are kept in ``.attrs["points"]`` (columns variant, run_id, x, value)."""
    rows = []
    for (variant, xv), g in points.groupby(["variant", x], sort=True):
        lo, hi = bootstrap_band(g["value"])
        rows.append({"variant": variant, "x": xv, "mean": float(g["value"].mean()), "lo": lo, "hi": hi,
                     "n": int(g["value"].notna().sum())})
    out = pd.DataFrame(rows, columns=["variant", "x", "mean", "lo", "hi", "n"])
    if "run_id" in points.columns:
        out.attrs["points"] = points.rename(columns={x: "x"})[["variant", "run_id", "x", "value"]]
    return out


def curve_by_step(history: pd.DataFrame, runs: pd.DataFrame, key: str, by=DEFAULT_BY) -> pd.DataFrame:
    """Per-variant mean/CI curve of metric ``key`` vs step (columns variant, x, mean, lo, hi, n)."""
    pts = history[history["key"] == key][["run_id", "step", "value"]]
    return _aggregate(_with_variant(pts, runs, by), "step")


def curve_by_time(history: pd.DataFrame, runs: pd.DataFrame, key: str, by=DEFAULT_BY,
                  grid_points: int = 60) -> pd.DataFrame:
    """Per-variant curve of ``key`` vs wall-clock seconds (``time/elapsed_s`` at that step).

    Each run's steps are mapped to elapsed seconds by interpolation (step 0 = 0 s), then every
    run is interpolated on a common grid per variant; grid points outside a run's range are
    left out of that run's contribution.
    """
    pts = history[history["key"] == key]
    clock = history[history["key"] == TIME_KEY]
    rows = []
    for run_id, g in pts.groupby("run_id"):
        c = clock[clock["run_id"] == run_id].sort_values("step").drop_duplicates("step", keep="last")
        if c.empty:
            continue
        cs, ct = c["step"].to_numpy(float), c["value"].to_numpy(float)
        if cs[0] > 0:
            cs, ct = np.r_[0.0, cs], np.r_[0.0, ct]
        g = g.sort_values("step").drop_duplicates("step", keep="last")
        t = np.interp(g["step"].to_numpy(float), cs, ct)
        rows.append(pd.DataFrame({"run_id": run_id, "t": t, "value": g["value"].to_numpy(float)}))
    if not rows:
        return pd.DataFrame(columns=["variant", "x", "mean", "lo", "hi", "n"])
    timed = _with_variant(pd.concat(rows, ignore_index=True), runs, by)
    gridded = []
    for variant, gv in timed.groupby("variant"):
        grid = np.linspace(0.0, gv["t"].max(), grid_points)
        for run_id, gr in gv.groupby("run_id"):
            inside = (grid >= gr["t"].min()) & (grid <= gr["t"].max())
            vals = np.interp(grid[inside], gr["t"].to_numpy(), gr["value"].to_numpy())
            gridded.append(pd.DataFrame({"variant": variant, "run_id": run_id, "t": grid[inside],
                                         "value": vals}))
    return _aggregate(pd.concat(gridded, ignore_index=True), "t")


def integer_steps(ax) -> None:
    """Integer ticks only on ``ax``'s x axis, a training step (matplotlib's default locator puts
    1.2, 1.4, ... between the steps of a short run). Every figure with steps on its x axis calls it."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _draw_curves(curves: pd.DataFrame, xlabel: str, ylabel: str, title: str, path: Path, steps: bool) -> Path:
    """Mean (and band) per variant vs ``x``; ``steps``: x is a training step (integer ticks)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if steps:
        integer_steps(ax)
    points = curves.attrs.get("points")
    for variant, g in curves.groupby("variant", sort=True):
        g = g.sort_values("x")
        few = int(g["n"].max()) < 3
        line, = ax.plot(g["x"], g["mean"], marker="." if len(g) < 30 else None,
                        label=f"{variant} (mean of {int(g['n'].max())}{', runs shown' if few else ''})")
        band = g["lo"].notna() & g["hi"].notna()
        if band.any():
            ax.fill_between(g["x"][band], g["lo"][band], g["hi"][band], alpha=0.2, color=line.get_color())
        if few and points is not None:  # too few runs for an interval: show each run
            for _, r in points[points["variant"] == variant].groupby("run_id"):
                r = r.sort_values("x")
                ax.plot(r["x"], r["value"], lw=0.8, ls="--", alpha=0.7, color=line.get_color())
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _grouped_bars(summary: pd.DataFrame, metric: str, ylabel: str, title: str, path: Path) -> Path | None:
    s = summary[(summary["metric"] == metric) & summary["mean"].notna()]
    if s.empty or "estimator" not in s.columns:
        return None
    hue = "group_size" if "group_size" in s.columns and s["group_size"].nunique() > 1 else None
    xs = sorted(s["estimator"].map(_norm).unique())
    hues = sorted(s[hue].dropna().unique()) if hue else [None]
    width = 0.8 / len(hues)
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(xs) * max(1, len(hues) / 2)), 4.2))
    for j, h in enumerate(hues):
        sub = s if h is None else s[s[hue] == h]
        sub = sub.assign(_x=sub["estimator"].map(_norm)).groupby("_x").first()
        means = [sub["mean"].get(x, np.nan) for x in xs]
        err = [[max(0.0, m - sub["ci_lo"].get(x, np.nan)) if pd.notna(sub["ci_lo"].get(x, np.nan)) else 0.0
                for x, m in zip(xs, means)],
               [max(0.0, sub["ci_hi"].get(x, np.nan) - m) if pd.notna(sub["ci_hi"].get(x, np.nan)) else 0.0
                for x, m in zip(xs, means)]]
        pos = np.arange(len(xs)) - 0.4 + width * (j + 0.5)
        ax.bar(pos, means, width, yerr=err, capsize=3, label=None if h is None else f"G={_norm(h)}")
    ax.set_xticks(np.arange(len(xs)), xs)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    if hue:
        ax.legend(fontsize="small", title="group size")
    return _save(fig, path)


def plot_final_vs_group_size(summary: pd.DataFrame, path: Path) -> Path | None:
    """Final eval accuracy (mean, CI error bars) vs group size, one line per estimator."""
    s = summary[(summary["metric"] == "final_eval_accuracy") & summary["mean"].notna()] \
        if {"estimator", "group_size"} <= set(summary.columns) else summary.iloc[0:0]
    if s.empty:
        return None
    s = s.assign(_g=pd.to_numeric(s["group_size"], errors="coerce")).dropna(subset=["_g"])
    if s.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for est, g in s.groupby(s["estimator"].map(_norm), sort=True):
        g = g.sort_values("_g")
        lo = (g["mean"] - g["ci_lo"]).fillna(0).clip(lower=0)
        hi = (g["ci_hi"] - g["mean"]).fillna(0).clip(lower=0)
        line, = ax.plot(g["_g"], g["mean"], marker="o", label=est)
        ax.errorbar(g["_g"], g["mean"], yerr=[lo, hi], fmt="none", capsize=3, ecolor=line.get_color())
    ax.set_xscale("log", base=2)
    groups = sorted(s["_g"].unique())
    ax.set_xticks(groups, [_norm(v) for v in groups])
    ax.set(xlabel="group size G", ylabel="final eval accuracy", title="Final accuracy vs group size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def plot_kl_vs_reward(history: pd.DataFrame, runs: pd.DataFrame, by, path: Path) -> Path | None:
    """Scatter of per-step (KL, reward) points with each variant's mean trajectory."""
    wide = history[history["key"].isin(["train/kl", "train/reward_mean"])]
    if wide.empty:
        return None
    wide = wide.pivot_table(index=["run_id", "step"], columns="key", values="value", aggfunc="last")
    if not {"train/kl", "train/reward_mean"} <= set(wide.columns):
        return None
    wide = _with_variant(wide.dropna().reset_index(), runs, by)
    if wide.empty:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for variant, g in wide.groupby("variant", sort=True):
        pts = ax.scatter(g["train/kl"], g["train/reward_mean"], s=10, alpha=0.35)
        traj = g.groupby("step")[["train/kl", "train/reward_mean"]].mean()
        ax.plot(traj["train/kl"], traj["train/reward_mean"], color=pts.get_facecolor()[0][:3], label=variant)
    ax.set(xlabel="train/kl", ylabel="train/reward_mean", title="KL vs reward (points: steps; line: mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    return _save(fig, path)


def make_plots(runs: pd.DataFrame, history: pd.DataFrame, summary: pd.DataFrame | None = None,
               out: str | Path = DEFAULT_OUT, by=DEFAULT_BY, verbose: bool = True) -> dict[str, Path]:
    """Write every figure it has data for to ``<out>/plots/``; return ``{file name: path}``."""
    plots_dir = Path(out) / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    by = [c for c in by if c in runs.columns]
    per_run = per_run_metrics(runs, history)
    if summary is None:
        summary = summarize(per_run, by)
    # always grouped by estimator x group size, whatever ``by`` is
    by_group = summarize(per_run, [c for c in ("estimator", "group_size") if c in per_run.columns],
                         ["final_eval_accuracy"])
    written: dict[str, Path | None] = {}
    for stem, (key, ylabel) in CURVES.items():
        step_curve = curve_by_step(history, runs, key, by)
        written[f"{stem}_vs_step.png"] = None if step_curve.empty else _draw_curves(
            step_curve, "training step", ylabel, f"{ylabel} vs step", plots_dir / f"{stem}_vs_step.png", steps=True)
        time_curve = curve_by_time(history, runs, key, by)
        written[f"{stem}_vs_time.png"] = None if time_curve.empty else _draw_curves(
            time_curve, "wall-clock (s)", ylabel, f"{ylabel} vs wall-clock", plots_dir / f"{stem}_vs_time.png",
            steps=False)
    written["final_accuracy_vs_group_size.png"] = plot_final_vs_group_size(
        by_group, plots_dir / "final_accuracy_vs_group_size.png")
    written["peak_memory.png"] = _grouped_bars(summary, "peak_mem_gib", "peak memory (GiB)",
                                               "Peak memory per estimator", plots_dir / "peak_memory.png")
    written["step_time.png"] = _grouped_bars(summary, "step_time_s", "step time (s)",
                                             "Mean step time per estimator", plots_dir / "step_time.png")
    written["kl_vs_reward.png"] = plot_kl_vs_reward(history, runs, by, plots_dir / "kl_vs_reward.png")
    comp = curve_by_step(history, runs, "train/completion_len_mean", by)
    written["completion_length.png"] = None if comp.empty else _draw_curves(
        comp, "training step", "completion length (tokens)", "Completion length over training",
        plots_dir / "completion_length.png", steps=True)
    for name, path in written.items():
        if verbose:
            print(f"[plots] wrote {path}" if path else f"[plots] skipped {name}: no data")
    return {name: path for name, path in written.items() if path is not None}


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=DEFAULT_OUT, help="folder with runs.csv/history.csv; "
                                                               "PNGs go to <results>/plots")
    parser.add_argument("--by", nargs="+", default=list(DEFAULT_BY), help="columns defining a variant")
    args = parser.parse_args(argv)
    coll = load_collection(args.results)
    make_plots(coll.runs, coll.history, None, args.results, split_cols(args.by))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
