"""Compare variants over seeds: means with 95% t-CIs, paired bootstrap differences.

Reads the frames written by ``python -m analysis.collect`` (``results/runs.csv``,
``results/history.csv``) and writes:

- ``per_run.csv``: one row per run with the derived metrics (``final_eval_accuracy``,
  ``reward_auc``, ``peak_mem_gib``, ``step_time_s``, ``wall_time_s``, ``final_pass_at_k``).
- ``summary.csv``: long format, one row per (variant, metric): ``n``, ``mean``, ``std``,
  ``ci_lo``, ``ci_hi`` (Student-t interval over seeds; NaN when n < 2).
- ``paired.csv`` (with ``--a``/``--b``): per metric the mean of A - B over runs paired by
  seed and the group-by columns not fixed by A/B, a paired percentile-bootstrap CI (fixed RNG
  seed) and Welch's t-test on the unpaired samples as a secondary check.

Example::

    python -m analysis.compare --by estimator group_size --a estimator=grpo --b estimator=ppo
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import DEFAULT_BY, DEFAULT_OUT
from analysis.collect import load_collection
from analysis.mdtable import markdown_table
from analysis.stats import paired_bootstrap_ci, t_ci, welch_p

METRICS = ["final_eval_accuracy", "reward_auc", "peak_mem_gib", "step_time_s", "wall_time_s",
           "final_pass_at_k"]
GIB = float(2 ** 30)


# ----------------------------------------------------------------------------- the reward curve
def reward_auc(steps, values) -> float:
    """Trapezoid area under ``values`` vs ``steps`` divided by the step span.

    Points are sorted by step and NaNs dropped; the result is the time-average of the curve
    (a single point returns its value, no points NaN).
    """
    s = np.asarray(steps, dtype=float)
    v = np.asarray(values, dtype=float)
    keep = ~(np.isnan(s) | np.isnan(v))
    s, v = s[keep], v[keep]
    if len(s) == 0:
        return math.nan
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    span = s[-1] - s[0]
    if span == 0:
        return float(v.mean())
    return float(np.sum((s[1:] - s[:-1]) * (v[1:] + v[:-1]) / 2.0) / span)


# ----------------------------------------------------------------------------- frames
def _last_values(history: pd.DataFrame) -> pd.DataFrame:
    """Last (highest step, then latest timestamp) value of every (run_id, key)."""
    if history.empty:
        return pd.DataFrame(columns=["run_id", "key", "value"])
    h = history.sort_values(["run_id", "key", "step", "timestamp"], kind="stable")
    return h.groupby(["run_id", "key"], as_index=False).last()[["run_id", "key", "value"]]


def per_run_metrics(runs: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """One row per run with the derived comparison metrics (see module docstring).

    Final metrics come from the ``final/*`` summary when logged, else from the histories
    (last ``eval/accuracy``, max ``perf/peak_mem_gib`` (or ``perf/peak_mem_bytes``), mean ``time/step_s``, last
    ``time/elapsed_s``, last ``eval/pass_at_k``).
    """
    keep = [c for c in runs.columns if not c.startswith(("params.", "metrics.", "tags."))]
    out = runs[keep].copy()
    last = _last_values(history).pivot(index="run_id", columns="key", values="value") \
        if not history.empty else pd.DataFrame()
    grouped = history.groupby(["run_id", "key"])["value"] if not history.empty else None

    def from_hist(key: str, how: str) -> pd.Series:
        if grouped is None:
            return pd.Series(math.nan, index=out.index)
        if how == "last":
            src = last[key] if key in last.columns else pd.Series(dtype=float)
        else:
            agg = grouped.agg(how)
            src = agg.xs(key, level="key") if key in agg.index.get_level_values("key") else pd.Series(dtype=float)
        return out["run_id"].map(src).astype(float)

    def final(col: str, fallback: pd.Series) -> pd.Series:
        if f"metrics.{col}" in runs.columns:
            vals = pd.to_numeric(runs[f"metrics.{col}"], errors="coerce").reset_index(drop=True)
            vals.index = out.index
            return vals.where(vals.notna(), fallback)
        return fallback

    out["final_eval_accuracy"] = final("final/eval_accuracy", from_hist("eval/accuracy", "last"))
    # newer runs log perf/peak_mem_gib, older ones perf/peak_mem_bytes
    gib = from_hist("perf/peak_mem_gib", "max")
    out["peak_mem_gib"] = final("final/peak_mem_bytes", gib.where(gib.notna(), from_hist("perf/peak_mem_bytes", "max") / GIB) * GIB) / GIB
    out["step_time_s"] = final("final/step_time_s_mean", from_hist("time/step_s", "mean"))
    out["wall_time_s"] = final("final/wall_time_s", from_hist("time/elapsed_s", "last"))
    out["final_pass_at_k"] = from_hist("eval/pass_at_k", "last")
    aucs = {}
    if not history.empty:
        rew = history[history["key"] == "train/reward_mean"].sort_values(["step", "timestamp"])
        for run_id, g in rew.groupby("run_id"):
            g = g.drop_duplicates("step", keep="last")
            aucs[run_id] = reward_auc(g["step"], g["value"])
    out["reward_auc"] = out["run_id"].map(aucs).astype(float)
    return out


def variant_label(row, by) -> str:
    """Human label for one variant, e.g. ``grpo G=8`` for by=(estimator, group_size)."""
    parts = []
    for col in by:
        val = row[col]
        text = _norm(val)
        parts.append(f"G={text}" if col == "group_size" else (text if col == "estimator" else f"{col}={text}"))
    return " ".join(parts)


def summarize(per_run: pd.DataFrame, by=DEFAULT_BY, metrics=None, conf: float = 0.95) -> pd.DataFrame:
    """Per variant (``by`` columns) and metric: n, mean, std, t-CI bounds over seeds (long)."""
    by = [c for c in by if c in per_run.columns]
    metrics = [m for m in (metrics or METRICS) if m in per_run.columns and per_run[m].notna().any()]
    rows = []
    groups = per_run.groupby(by, dropna=False, sort=True) if by else [((), per_run)]
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        for m in metrics:
            mean, lo, hi, n = t_ci(g[m], conf)
            std = float(g[m].std(ddof=1)) if n > 1 else math.nan
            rows.append({**dict(zip(by, key)), "metric": m, "n": n, "mean": mean, "std": std,
                         "ci_lo": lo, "ci_hi": hi})
    return pd.DataFrame(rows, columns=[*by, "metric", "n", "mean", "std", "ci_lo", "ci_hi"])


def parse_variant(text: str) -> dict[str, str]:
    """Parse ``"estimator=grpo,group_size=8"`` into ``{"estimator": "grpo", "group_size": "8"}``."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=VALUE[,KEY=VALUE], got {text!r}")
        out[key.strip()] = value.strip()
    return out


def _norm(value) -> str:
    """Normalise a cell for matching: 8, 8.0, "8" and "8.0" all become "8"."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    try:
        f = float(value)
        if f.is_integer():
            return str(int(f))
        return repr(f)
    except (TypeError, ValueError):
        return str(value).strip()


def _select(df: pd.DataFrame, spec: dict) -> pd.DataFrame:
    mask = pd.Series(True, index=df.index)
    for key, val in spec.items():
        if key not in df.columns:
            raise KeyError(f"unknown column {key!r} in variant spec")
        mask &= df[key].map(_norm) == _norm(val)
    return df[mask]


def paired_compare(per_run: pd.DataFrame, a: dict, b: dict, by=DEFAULT_BY, metrics=None,
                   n_boot: int = 10000, seed: int = 0, conf: float = 0.95) -> pd.DataFrame:
    """Paired comparison A - B per metric.

    Runs are paired on ``seed`` plus the ``by`` columns not fixed by ``a``/``b`` (several runs
    with the same key are averaged). Returns one row per metric with ``mean_diff``, the
    bootstrap CI ``boot_lo``/``boot_hi`` (RNG ``seed``) and Welch's ``welch_t``/``welch_p``.
    """
    metrics = [m for m in (metrics or METRICS) if m in per_run.columns and per_run[m].notna().any()]
    pair_on = [c for c in (*by, "seed") if c in per_run.columns and c not in a and c not in b]
    da, db = _select(per_run, a), _select(per_run, b)
    rows = []
    for m in metrics:
        xa, xb = da[["run_id", *pair_on, m]].copy(), db[["run_id", *pair_on, m]].copy()
        for frame in (xa, xb):
            frame["_key"] = frame[pair_on].apply(lambda r: tuple(_norm(v) for v in r), axis=1) \
                if pair_on and len(frame) else [()] * len(frame)
        ma, mb = xa.groupby("_key")[m].mean(), xb.groupby("_key")[m].mean()
        common = ma.index.intersection(mb.index)
        diffs = (ma[common] - mb[common]).dropna().to_numpy()
        lo, hi = paired_bootstrap_ci(diffs, n_boot, conf, seed)
        t, p = welch_p(xa[m], xb[m])
        rows.append({"metric": m, "a": _spec_text(a), "b": _spec_text(b), "pair_on": ",".join(pair_on),
                     "n_a": int(xa[m].notna().sum()), "n_b": int(xb[m].notna().sum()),
                     "n_pairs": len(diffs), "mean_a": float(xa[m].mean()), "mean_b": float(xb[m].mean()),
                     "mean_diff": float(diffs.mean()) if len(diffs) else math.nan,
                     "boot_lo": lo, "boot_hi": hi, "welch_t": t, "welch_p": p})
    return pd.DataFrame(rows)


def _spec_text(spec: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in spec.items())


def run_compare(runs: pd.DataFrame, history: pd.DataFrame, out=DEFAULT_OUT, by=DEFAULT_BY,
                a: dict | None = None, b: dict | None = None, metrics=None, n_boot: int = 10000,
                seed: int = 0, conf: float = 0.95, verbose: bool = True) -> dict[str, pd.DataFrame]:
    """Compute per-run metrics, the summary and (if ``a`` and ``b``) the paired table; save CSVs."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    per_run = per_run_metrics(runs, history)
    summary = summarize(per_run, by, metrics, conf)
    frames = {"per_run": per_run, "summary": summary}
    if a and b:
        frames["paired"] = paired_compare(per_run, a, b, by, metrics, n_boot, seed, conf)
    for name, frame in frames.items():
        frame.to_csv(out / f"{name}.csv", index=False)
        if verbose:
            print(f"[compare] wrote {out / f'{name}.csv'}")
    if verbose and not summary.empty:
        print(markdown_table(summary))
        if "paired" in frames:
            print(markdown_table(frames["paired"]))
    return frames


def split_cols(values) -> list[str]:
    """Flatten ``["a,b", "c"]`` -> ``["a", "b", "c"]`` (CLI columns lists)."""
    return [p.strip() for v in values or [] for p in v.split(",") if p.strip()]


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    parser = argparse.ArgumentParser(prog="python -m analysis.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=DEFAULT_OUT, help="folder with runs.csv/history.csv (and output)")
    parser.add_argument("--by", nargs="+", default=list(DEFAULT_BY), help="group-by columns")
    parser.add_argument("--metrics", nargs="+", default=None, help=f"subset of {METRICS}")
    parser.add_argument("--a", default=None, help="variant A, KEY=VALUE[,KEY=VALUE]")
    parser.add_argument("--b", default=None, help="variant B, KEY=VALUE[,KEY=VALUE]")
    parser.add_argument("--n-boot", type=int, default=10000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap RNG seed")
    parser.add_argument("--conf", type=float, default=0.95, help="confidence level")
    args = parser.parse_args(argv)
    if bool(args.a) != bool(args.b):
        parser.error("--a and --b go together")
    coll = load_collection(args.results)
    run_compare(coll.runs, coll.history, args.results, split_cols(args.by),
                parse_variant(args.a) if args.a else None, parse_variant(args.b) if args.b else None,
                split_cols(args.metrics) or None, args.n_boot, args.seed, args.conf)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
