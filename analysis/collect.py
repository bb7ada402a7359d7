"""Collect grpo-harness MLflow runs into tidy pandas DataFrames.

Produces two frames and writes them under ``--out`` (default ``reports/``, git-ignored):

- ``runs.csv``: one row per run -- ``run_id``, ``run_name``, ``experiment``, ``status``,
  convenience columns (``estimator``, ``group_size``, ``seed``, ``task``, ``model``,
  ``sweep``, ``git_commit``; taken from the tags, falling back to the params), then every
  ``tags.*``, ``params.*`` and ``metrics.*`` column (metrics hold the last logged value).
- ``history.csv``: long format ``run_id, key, step, value, timestamp``, one row per logged
  metric point (from ``MlflowClient.get_metric_history``).
- ``skipped_runs.csv``: runs that were not FINISHED and therefore skipped (unless
  ``--include-unfinished``); they are also printed.
- ``duplicate_runs.csv``: runs dropped as duplicates of the same job (unless
  ``--keep-duplicates``): the same experiment and ``config_key`` tag (the job's config and seed,
  :func:`harness.launch.job.config_key`). Older harness versions trained a finished job again when its
  command was rerun (a requeued SLURM job, a re-submitted multirun), leaving two runs of one
  seed that a study would count twice. The latest-started FINISHED run of each job is kept (a
  job started again on purpose, ``resume=never`` or a new ``checkpoint.dir``, supersedes the
  earlier run); each dropped run is printed with the run it duplicates. Runs tagged
  ``rerun_of`` (``python -m harness.launch.rerun``: a deliberate repeat) are never dropped.

Example::

    python -m analysis.collect --experiment grpo-harness --sweep my-sweep --tag task=gsm8k
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import pandas as pd
from mlflow import MlflowClient

from analysis import DEFAULT_EXPERIMENT, DEFAULT_OUT, DEFAULT_TRACKING_URI
from harness.launch.tracking import close_stale_runs

HISTORY_COLUMNS = ["run_id", "key", "step", "value", "timestamp"]
# convenience column -> (tag name, param fallback)
CONVENIENCE = {
    "estimator": ("estimator", "advantage.name"),
    "group_size": ("group_size", "group_size"),
    "seed": ("seed", "seed"),
    "task": ("task", "task.name"),
    "model": ("model", "model.name_or_path"),
    "sweep": ("sweep", None),
    "git_commit": ("git_commit", None),
}
NUMERIC_CONVENIENCE = ("group_size", "seed")
SKIPPED_COLUMNS = ["run_id", "run_name", "experiment", "status", "estimator", "group_size",
                   "seed", "sweep"]
DUPLICATE_COLUMNS = ["run_id", "duplicate_of", "config_key", *SKIPPED_COLUMNS[1:]]


@dataclass
class Collection:
    """Result of :func:`collect_runs`: kept runs, their metric histories, skipped runs."""

    runs: pd.DataFrame
    history: pd.DataFrame
    skipped: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SKIPPED_COLUMNS))
    duplicates: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=DUPLICATE_COLUMNS))


def resolve_tracking_uri(uri: str | None = None) -> str:
    """Return ``uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``."""
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def parse_tags(items: list[str] | None) -> dict[str, str]:
    """Parse repeated ``key=value`` strings into a dict (raises ``ValueError`` on bad items)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {item!r}")
        out[key.strip()] = value.strip()
    return out


def build_filter(tags: dict[str, str] | None = None, sweep: str | None = None) -> str:
    """Build an MLflow ``filter_string`` matching all ``tags`` (and ``tags.sweep`` = sweep)."""
    tags = dict(tags or {})
    if sweep is not None:
        tags["sweep"] = sweep
    clauses = []
    for key, value in tags.items():
        escaped = str(value).replace("'", "\\'")
        clauses.append(f"tags.`{key}` = '{escaped}'")
    return " and ".join(clauses)


def _coerce_numeric(series: pd.Series) -> pd.Series:
    """Convert to integers when every present value is integral, else keep as is."""
    num = pd.to_numeric(series, errors="coerce")
    if num.notna().sum() != series.notna().sum():
        return series  # some non-numeric values: leave the strings alone
    if num.notna().any() and (num.dropna() % 1 == 0).all():
        return num.astype("Int64")
    return num


def _tidy_runs(raw: pd.DataFrame, exp_names: dict[str, str]) -> pd.DataFrame:
    """Turn an ``mlflow.search_runs`` frame into the documented ``runs`` layout."""
    df = raw.copy()
    df["experiment"] = df["experiment_id"].astype(str).map(exp_names)
    df["run_name"] = df.get("tags.mlflow.runName")
    for col, (tag, param) in CONVENIENCE.items():
        values = df.get(f"tags.{tag}")
        if values is None:
            values = pd.Series([None] * len(df), index=df.index, dtype=object)
        if param is not None and f"params.{param}" in df:
            values = values.where(values.notna(), df[f"params.{param}"])
        df[col] = values
    for col in NUMERIC_CONVENIENCE:
        df[col] = _coerce_numeric(df[col])
    drop = [c for c in df.columns if c.startswith("tags.mlflow.") or c == "artifact_uri"]
    df = df.drop(columns=drop)
    front = ["run_id", "run_name", "experiment", "experiment_id", "status", "start_time",
             "end_time", *CONVENIENCE]
    rest = sorted(c for c in df.columns if c not in front)
    rest = ([c for c in rest if c.startswith("tags.")] + [c for c in rest if c.startswith("params.")]
            + [c for c in rest if c.startswith("metrics.")]
            + [c for c in rest if not c.startswith(("tags.", "params.", "metrics."))])
    return df[[c for c in front if c in df.columns] + rest].reset_index(drop=True)


def find_duplicates(runs: pd.DataFrame) -> pd.DataFrame:
    """Runs of ``runs`` that repeat another run of the same job, as ``DUPLICATE_COLUMNS`` rows.

    A job is an (``experiment``, ``tags.config_key``) pair; runs without that tag (not written by
    ``python -m harness.run``) or tagged ``rerun_of`` are never duplicates. Of each job's runs the kept one
    is the latest-started FINISHED run (the latest run when none finished); every other run is a
    duplicate whose ``duplicate_of`` names the kept run.
    """
    if "tags.config_key" not in runs or not len(runs):
        return pd.DataFrame(columns=DUPLICATE_COLUMNS)
    rerun = runs["tags.rerun_of"].notna() if "tags.rerun_of" in runs else pd.Series(False, index=runs.index)
    cand = runs.loc[runs["tags.config_key"].notna() & ~rerun].copy()
    cand["_finished"] = cand["status"] == "FINISHED"
    cand = cand.sort_values(["_finished", "start_time"], ascending=[False, False], kind="stable")
    rows = []
    for (_, key), group in cand.groupby(["experiment", "tags.config_key"], sort=False):
        kept = group.iloc[0]
        for _, r in group.iloc[1:].iterrows():
            rows.append({"run_id": r["run_id"], "duplicate_of": kept["run_id"], "config_key": key,
                         **{c: r.get(c) for c in SKIPPED_COLUMNS[1:]}})
    return pd.DataFrame(rows, columns=DUPLICATE_COLUMNS)


def fetch_history(client, run_ids: list[str], runs: pd.DataFrame) -> pd.DataFrame:
    """Fetch every logged metric history of ``run_ids`` as a long frame."""
    rows = []
    metric_cols = [c for c in runs.columns if c.startswith("metrics.")]
    for run_id in run_ids:
        row = runs.loc[runs["run_id"] == run_id, metric_cols]
        keys = [c[len("metrics."):] for c in metric_cols if row[c].notna().any()]
        for key in keys:
            for m in client.get_metric_history(run_id, key):
                rows.append((run_id, m.key, int(m.step), float(m.value), int(m.timestamp)))
    hist = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    return hist.sort_values(["run_id", "key", "step", "timestamp"], kind="stable").reset_index(drop=True)


def collect_runs(tracking_uri: str | None = None, experiments: list[str] | None = None,
                 tags: dict[str, str] | None = None, sweep: str | None = None,
                 include_unfinished: bool = False, verbose: bool = True,
                 stale_after_hours: float | None = 6.0, keep_duplicates: bool = False) -> Collection:
    """Query MLflow and return a :class:`Collection` of tidy frames.

    Only runs whose status is ``FINISHED`` are kept unless ``include_unfinished``; the
    others (FAILED, RUNNING, KILLED, ...) go to ``Collection.skipped`` and are printed.
    Experiments that do not exist are reported and ignored. First, RUNNING runs whose process
    is gone (this host, dead pid) or whose heartbeat is older than ``stale_after_hours`` are
    closed as KILLED with the tag ``harness.closed_reason`` (:func:`harness.launch.tracking.close_stale_runs`;
    None leaves them alone). Then duplicate runs of one job (:func:`find_duplicates`) are printed
    with the run they repeat and dropped into ``Collection.duplicates`` unless ``keep_duplicates``.
    """
    uri = resolve_tracking_uri(tracking_uri)
    experiments = list(experiments or [DEFAULT_EXPERIMENT])
    empty = Collection(runs=pd.DataFrame(columns=["run_id", "status", "experiment", *CONVENIENCE]),
                       history=pd.DataFrame(columns=HISTORY_COLUMNS))
    db_path = _sqlite_path(uri)
    if db_path is not None and not db_path.exists():  # do not let MLflow create an empty store
        _say(verbose, f"[collect] no MLflow store at {db_path} ({uri}); nothing collected")
        return empty
    client = MlflowClient(tracking_uri=uri)
    exp_names = _experiments(client, experiments, uri, verbose)
    if not exp_names:
        return empty
    if stale_after_hours is not None:
        running = client.search_runs(list(exp_names), "attributes.status = 'RUNNING'")
        for run_id, reason in close_stale_runs(client, running, stale_after_hours * 3600):
            _say(verbose, f"[collect] closed stale run {run_id} as KILLED: {reason}")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        raw = mlflow.search_runs(experiment_ids=list(exp_names), filter_string=build_filter(tags, sweep),
                                 order_by=["attributes.start_time ASC"])
    finally:
        mlflow.set_tracking_uri(previous)
    if raw is None or len(raw) == 0:
        _say(verbose, "[collect] no runs matched")
        return empty
    runs, skipped = _split_unfinished(_tidy_runs(raw, exp_names), include_unfinished, verbose)
    runs, duplicates = _split_duplicates(runs, keep_duplicates)
    history = fetch_history(client, runs["run_id"].tolist(), runs)
    _say(verbose, f"[collect] {len(runs)} run(s), {len(history)} history point(s) from {uri}")
    return Collection(runs=runs, history=history, skipped=skipped, duplicates=duplicates)


def _experiments(client, names: list[str], uri: str, verbose: bool) -> dict[str, str]:
    """``{experiment id: name}`` of the experiments ``names`` that exist in the store (the others named)."""
    out: dict[str, str] = {}
    for name in names:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            _say(verbose, f"[collect] experiment {name!r} not found in {uri}; ignored")
        else:
            out[str(exp.experiment_id)] = name
    return out


def _split_unfinished(runs: pd.DataFrame, include_unfinished: bool, verbose: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, skipped)``: the runs not FINISHED, printed, and left out of ``runs`` unless
    ``include_unfinished``."""
    unfinished = runs["status"] != "FINISHED"
    skipped = runs.loc[unfinished, [c for c in SKIPPED_COLUMNS if c in runs.columns]].reset_index(drop=True)
    if len(skipped):
        action = "included" if include_unfinished else "skipped"
        _say(verbose, f"[collect] {len(skipped)} unfinished/failed run(s) {action}:")
        for _, r in skipped.iterrows():
            _say(verbose, f"  {r['run_id']}  {r['status']:<9} estimator={r.get('estimator')} "
                          f"group_size={r.get('group_size')} seed={r.get('seed')} name={r.get('run_name')}")
    if not include_unfinished:
        runs = runs.loc[~unfinished].reset_index(drop=True)
    return runs, skipped


def _split_duplicates(runs: pd.DataFrame, keep_duplicates: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(runs, duplicates)``: the duplicate runs of one job (:func:`find_duplicates`), printed with the
    run each repeats, and left out of ``runs`` unless ``keep_duplicates``."""
    duplicates = find_duplicates(runs)
    if len(duplicates):
        action = "kept (--keep-duplicates)" if keep_duplicates else "dropped"
        _say(True, f"[collect] warning: {len(duplicates)} duplicate run(s) of the same (config, seed) {action}; "
                   "a study must count each seed once:")
        for _, r in duplicates.iterrows():
            _say(True, f"  {r['run_id']}  duplicates {r['duplicate_of']} (config_key {r['config_key']}, "
                       f"estimator={r.get('estimator')} group_size={r.get('group_size')} seed={r.get('seed')} "
                       f"name={r.get('run_name')})")
        if not keep_duplicates:
            runs = runs.loc[~runs["run_id"].isin(duplicates["run_id"])].reset_index(drop=True)
    return runs, duplicates


def save_collection(coll: Collection, out: str | Path = DEFAULT_OUT, parquet: bool = False) -> dict[str, Path]:
    """Write ``runs``/``history``/``skipped_runs`` as CSV (and parquet if asked) under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, frame in (("runs", coll.runs), ("history", coll.history), ("skipped_runs", coll.skipped),
                        ("duplicate_runs", coll.duplicates)):
        paths[name] = out / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
        if parquet:
            try:
                frame.to_parquet(out / f"{name}.parquet", index=False)
                paths[f"{name}_parquet"] = out / f"{name}.parquet"
            except (ImportError, ValueError) as exc:  # pyarrow missing or exotic dtypes
                print(f"[collect] parquet for {name} not written: {exc}", file=sys.stderr)
    return paths


def load_collection(out: str | Path = DEFAULT_OUT) -> Collection:
    """Read back the CSV files written by :func:`save_collection`."""
    out = Path(out)
    str_cols = {"run_id": str, "key": str, "experiment_id": str, "run_name": str,
                "estimator": str, "task": str, "model": str, "sweep": str, "git_commit": str}

    def _read(name: str, columns: list[str]) -> pd.DataFrame:
        path = out / f"{name}.csv"
        if not path.exists() or path.stat().st_size == 0:
            return pd.DataFrame(columns=columns)
        head = pd.read_csv(path, nrows=0).columns
        return pd.read_csv(path, dtype={k: v for k, v in str_cols.items() if k in head})

    if not (out / "runs.csv").exists():
        raise FileNotFoundError(f"{out / 'runs.csv'} not found; run `python -m analysis.collect` first")
    return Collection(runs=_read("runs", ["run_id", "status"]), history=_read("history", HISTORY_COLUMNS),
                      skipped=_read("skipped_runs", SKIPPED_COLUMNS),
                      duplicates=_read("duplicate_runs", DUPLICATE_COLUMNS))


def _sqlite_path(uri: str) -> Path | None:
    """File path of a ``sqlite:///`` URI (None for other schemes or in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def _say(verbose: bool, msg: str) -> None:
    if verbose:
        print(msg)


def add_query_args(parser: argparse.ArgumentParser) -> None:
    """Add the MLflow query options shared by ``collect`` and ``report``."""
    parser.add_argument("--tracking-uri", default=None,
                        help=f"MLflow tracking URI (default: $MLFLOW_TRACKING_URI or {DEFAULT_TRACKING_URI})")
    parser.add_argument("--experiment", action="append", default=None, metavar="NAME",
                        help=f"experiment name, repeatable (default: {DEFAULT_EXPERIMENT})")
    parser.add_argument("--tag", action="append", default=None, metavar="KEY=VALUE",
                        help="keep runs whose tag KEY equals VALUE; repeatable (AND)")
    parser.add_argument("--sweep", default=None, metavar="ID", help="keep runs with tag sweep=ID")
    parser.add_argument("--include-unfinished", action="store_true",
                        help="keep FAILED/RUNNING/KILLED runs instead of skipping them")
    parser.add_argument("--keep-duplicates", action="store_true",
                        help="keep every run of a job that was trained more than once (same config_key tag); "
                             "by default only the latest FINISHED one is kept and the others are named")
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default: {DEFAULT_OUT}/, git-ignored)")
    parser.add_argument("--stale-after-hours", type=float, default=6.0,
                        help="close RUNNING runs whose process is gone or whose heartbeat is older than this "
                             "as KILLED (default 6; a negative value disables)")


def stale_hours(args) -> float | None:
    """``--stale-after-hours`` as :func:`collect_runs` takes it (negative = disabled)."""
    return None if args.stale_after_hours < 0 else args.stale_after_hours


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: collect and write the frames."""
    parser = argparse.ArgumentParser(prog="python -m analysis.collect", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_query_args(parser)
    parser.add_argument("--parquet", action="store_true", help="also write .parquet files (needs pyarrow)")
    args = parser.parse_args(argv)
    coll = collect_runs(args.tracking_uri, args.experiment, parse_tags(args.tag), args.sweep,
                        args.include_unfinished, stale_after_hours=stale_hours(args),
                        keep_duplicates=args.keep_duplicates)
    for name, path in save_collection(coll, args.out, args.parquet).items():
        print(f"[collect] wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
