"""``python -m harness.run [overrides] [-m]``: one training job, or a Hydra multirun of jobs.

The entry point only (also pyproject's ``harness-run``); the job is :mod:`harness.launch.run`.
"""

import os

from harness.launch.run import main

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
