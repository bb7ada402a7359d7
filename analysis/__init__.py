"""Analysis scripts for grpo-harness MLflow runs.

Modules (each runnable as ``python -m analysis.<name> --help`` from the repo root):

- :mod:`analysis.collect` -- MLflow runs -> tidy ``runs`` / ``history`` frames under ``results/``.
- :mod:`analysis.compare` -- per-variant mean and 95% t-CI over seeds, paired bootstrap
  comparison of two variants, reward AUC, unbiased pass@k.
- :mod:`analysis.plots` -- PNG figures under ``results/plots/``.
- :mod:`analysis.report` -- one command: collect -> compare -> plots -> ``results/REPORT.md``.

The package deliberately imports neither torch nor ``harness`` so it runs anywhere the
MLflow store is readable.
"""

DEFAULT_EXPERIMENT = "grpo-harness"
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_OUT = "results"
DEFAULT_BY = ("estimator", "group_size")
