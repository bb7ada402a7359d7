"""Tasks registered by name (:data:`TASKS`); ``task=<name>`` in the config picks one.

Every module of this package is imported here, so a module that registers a task (see
:mod:`harness.tasks.base`) is all it takes to add one: there is no list to edit.
"""

from __future__ import annotations

from harness.registry import import_package_modules
from harness.tasks.base import TASKS, Problem, Task, TaskConfig

import_package_modules(__name__)


def build_task(cfg) -> Task:
    """Instantiate the task named by ``cfg.name`` with its config node ``cfg``.

    Raises:
        ValueError: unknown task name (the message lists the valid names).
    """
    return TASKS.get(cfg.name)(cfg)


__all__ = ["Problem", "Task", "TaskConfig", "TASKS", "build_task"]
