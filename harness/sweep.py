"""``python -m harness.sweep sweeps/<name>.yaml [overrides] [options]``: an Optuna sweep.

The entry point only; the sweep driver is :mod:`harness.launch.sweep`.
"""

import sys

from harness.launch.sweep import main

if __name__ == "__main__":
    sys.exit(main())
