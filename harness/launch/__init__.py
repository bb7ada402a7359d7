"""What launches and records jobs: one job (``python -m harness.run``: :mod:`.run`, its identity,
lock and plan in :mod:`.job`, its final prints in :mod:`.summary`), sweeps (``python -m
harness.sweep``: :mod:`.sweep`, :mod:`.sweep_spec`, :mod:`.sweep_study`), reruns, the config
schema and its startup checks, the configuration reference, MLflow tracking and credentials."""
