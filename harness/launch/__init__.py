"""What launches and records jobs: ``python -m harness.run`` and ``python -m harness.sweep``
(their thin entry modules call into here), reruns, the config schema and its checks,
the reference docs, MLflow tracking, credentials."""
