"""Analysis of grpo-harness MLflow runs: tables, figures, reports and pre-registered studies.

It reads what the runs logged (MLflow stores, their per-problem eval artifacts) and never trains.
Each module with a command line runs as ``python -m analysis.<name> --help`` from any folder (the
package installs with ``harness``; ``harness-report`` is :mod:`analysis.report`'s console script).

Statistics, the one place every report takes them from:

- :mod:`analysis.stats` -- the paired t / TOST verdict rule, exact power, seeds needed and the
  smallest detectable effect (``paired``), the sequential t boundaries (``boundaries``), the
  bootstraps (``bootstrap``), several arms against one control (``family``).

Reports:

- :mod:`analysis.study` -- pre-registered studies (``studies/<name>.yaml``): runs what a design
  needs, decides its verdict, writes ``results/studies/`` and ``results/STUDIES.md`` (a package:
  spec, store, verdicts, launch, figures, render, reporting, overview, cli, and precision: the CPU
  a bf16-autocast arm needs).
- :mod:`analysis.ablation` -- the estimator ablation report, ``results/ABLATION.md``; its per-run
  record of per-problem greedy verdicts (``RunRecord``, ``load_sweep``) is what the studies read.
- :mod:`analysis.collect` -- MLflow runs -> tidy ``runs`` / ``history`` frames under ``reports/``
  (git-ignored; ``--out`` for elsewhere), duplicates of one job dropped.
- :mod:`analysis.compare` -- per-variant mean and 95% t-CI over seeds, paired bootstrap
  comparison of two variants, reward AUC.
- :mod:`analysis.plots` -- PNG figures under ``reports/plots/``.
- :mod:`analysis.report` -- one command: collect -> compare -> plots -> ``reports/REPORT.md``.

Tools:

- :mod:`analysis.noise` -- where a study's paired spread comes from (eval noise vs training noise).
- :mod:`analysis.synthetic` -- a synthetic MLflow store with exact values, and simulated paired
  studies, for tests and trials.
- :mod:`analysis.screenshot` -- screenshots of the MLflow UI or optuna-dashboard.
- :mod:`analysis.mdtable` -- markdown tables without ``tabulate``.

Relation to ``harness``: ``analysis`` imports :mod:`harness.launch.tracking` (in ``collect`` and
``ablation``: a run's artifacts, closing stale runs) and :mod:`harness.runtime.provenance` (in
``study.precision``: the CPU's native bf16 flags) and nothing else of it; ``harness`` never imports
``analysis`` (``tests/test_layers.py``). No module of the package imports torch, and
:mod:`analysis.stats` imports nothing of the repository.
"""

DEFAULT_EXPERIMENT = "grpo-harness"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
# Reports go to an untracked folder unless --out says otherwise: regenerating the committed
# results/ is done on purpose (--out results), never by default (a report must not dirty the tree,
# or every later run records git_dirty).
DEFAULT_OUT = "reports"
DEFAULT_BY = ("estimator", "group_size")
