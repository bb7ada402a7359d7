"""Analysis scripts for grpo-harness MLflow runs.

Modules (each runnable as ``python -m analysis.<name> --help`` from any folder: the package installs
with ``harness``; ``harness-report`` is :mod:`analysis.report`'s console script):

- :mod:`analysis.collect` -- MLflow runs -> tidy ``runs`` / ``history`` frames under ``reports/``
  (git-ignored; ``--out`` for elsewhere).
- :mod:`analysis.compare` -- per-variant mean and 95% t-CI over seeds, paired bootstrap
  comparison of two variants, reward AUC, unbiased pass@k.
- :mod:`analysis.plots` -- PNG figures under ``reports/plots/``.
- :mod:`analysis.report` -- one command: collect -> compare -> plots -> ``reports/REPORT.md``.

The package deliberately imports neither torch nor ``harness`` so it runs anywhere the
MLflow store is readable.
"""

DEFAULT_EXPERIMENT = "grpo-harness"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
# Reports go to an untracked folder unless --out says otherwise: regenerating the committed
# results/ is done on purpose (--out results), never by default (a report must not dirty the tree,
# or every later run records git_dirty).
DEFAULT_OUT = "reports"
DEFAULT_BY = ("estimator", "group_size")
