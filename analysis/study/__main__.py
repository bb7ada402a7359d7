"""``python -m analysis.study``: :func:`analysis.study.cli.main`."""

from analysis.study.cli import main

raise SystemExit(main())
