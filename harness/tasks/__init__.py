"""Tasks registered by name; ``task=<name>`` in the config picks one."""

from __future__ import annotations

import importlib

from harness.tasks.base import Problem, Task

TASKS = {
    "gsm8k": "harness.tasks.gsm8k:GSM8KTask",
    "math": "harness.tasks.math:MathTask",
    "arith": "harness.tasks.arith:ArithTask",
}


def build_task(cfg) -> Task:
    """Instantiate the task named by ``cfg.name``.

    Raises:
        ValueError: unknown task name (the message lists the valid names).
    """
    if cfg.name not in TASKS:
        raise ValueError(f"task={cfg.name!r} is not a task; expected one of {sorted(TASKS)}")
    module, cls = TASKS[cfg.name].split(":")
    # dynamic by design: the registry names each task's module, imported when the task is chosen
    return getattr(importlib.import_module(module), cls)(cfg)


__all__ = ["Problem", "Task", "TASKS", "build_task"]
