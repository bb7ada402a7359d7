"""Pre-registered studies: one YAML file per claim, one command runs what is missing and reports.

    python -m analysis.study studies/positive_control.yaml            # run missing jobs, then report
    python -m analysis.study --no-run studies/*.yaml                   # reports from the stores only
    python -m analysis.study --gpu studies/dapo_clip_higher.yaml       # the file's GPU arm set
    python -m analysis.study --t-table studies/*.yaml                  # the t boundaries of their designs

The study file's keys and what the command does: :mod:`analysis.study`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from analysis import stats
from analysis.study.launch import run_study
from analysis.study.overview import index
from analysis.study.reporting import report
from analysis.study.spec import RESULTS, StudyError, check_registration, load_study
from analysis.study.store import load_records
from analysis.study.verdicts import t_table_designs


def main(argv=None) -> int:
    """Run (unless ``--no-run``) and report each study file, then write the index; 2 on a
    :class:`~analysis.study.spec.StudyError` (printed)."""
    ap = argparse.ArgumentParser(prog="python -m analysis.study", description=__doc__.split("\n\n")[0])
    ap.add_argument("studies", nargs="+", type=Path, help="studies/<name>.yaml files")
    ap.add_argument("--no-run", action="store_true", help="report from the stores; launch nothing")
    ap.add_argument("--gpu", action="store_true", help="the study file's gpu arm set")
    ap.add_argument("--jobs", type=int, default=None, help="jobs at once (joblib); default: the file's `jobs`")
    ap.add_argument("--launcher", default=None, help="hydra/launcher: joblib, slurm, ray_local")
    ap.add_argument("--keep-checkpoints", action="store_true")
    ap.add_argument("--machine", default=None, help="the machine named in the report (default: the one the runs "
                    "recorded, else /proc/cpuinfo)")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--t-table", action="store_true", help="derive the t boundaries of the studies' sequential "
                    "designs into analysis/stats/t_boundaries.json (with the designs already there); nothing else")
    args = ap.parse_args(argv)
    if args.t_table:
        designs = [d for f in args.studies for d in t_table_designs(load_study(f))]
        print(f"wrote {stats.write_t_table(designs)}: {len(designs)} study design(s) and the table's others")
        return 0
    for f in args.studies:
        try:
            spec = load_study(f, gpu=args.gpu)
            if args.no_run:
                check_registration(spec, args.results, has_finished=any(load_records(spec, args.results).values()))
            else:
                run_study(spec, args.results, args.jobs, args.launcher, args.keep_checkpoints)
            res = report(spec, f, args.results, args.machine)
        except StudyError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for label, r in ((f"{spec['name']}: {a} - {spec['control']}", r) for a, r in res["comparisons"].items()) \
                if "comparisons" in res else [(spec["name"], res)]:
            print(f"{label}: {r['verdict_text']}; effect {r['effect_text']}")
    index(args.results, args.studies[0].parent)
    return 0
