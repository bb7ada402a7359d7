"""A run with a tool exits when it is done, even after a tool call that never returns (issue 32).

The cause of the hang seen after a smoke run's summary: the tool calls ran on a
``concurrent.futures.ThreadPoolExecutor``, whose worker threads the interpreter joins at exit
(``concurrent.futures.thread._python_exit``); a call abandoned after ``tools.timeout_s`` that never
returned kept the process alive forever. The runner's worker is now a daemon thread, stopped by
``close()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from harness.tools import Observation, ToolConfig, ToolRunner
from tests.conftest import job_threads

ROOT = Path(__file__).resolve().parents[1]


def _forever(_):
    threading.Event().wait()


def test_a_hung_call_leaves_no_thread_that_blocks_exit():
    runner = ToolRunner(_forever, ToolConfig(timeout_s=0.1))
    assert runner.observe("1") == Observation("error: timed out after 0.1 s", True)
    assert runner.observe("2").error  # a fresh worker, hung too
    hung = [t for t in threading.enumerate() if t.name == "tool" and t.is_alive()]
    assert len(hung) >= 2 and all(t.daemon for t in hung)  # the interpreter does not join daemons
    runner.tool = lambda s: s + "!"
    assert runner.observe("ok") == Observation("ok!", False)
    worker = runner._worker.thread
    t0 = time.perf_counter()
    runner.close()
    runner.close()  # idempotent
    worker.join(timeout=5)
    assert not worker.is_alive() and time.perf_counter() - t0 < 5  # an idle worker ends on close()
    assert runner.observe("again") == Observation("again!", False)  # a later call starts a new one
    runner.close()


_HANGING_RUN = """
import runpy, sys, threading
from harness.tools import calculator
calculator.Calculator.__call__ = lambda self, expr: threading.Event().wait()  # every call hangs
sys.argv = ["harness.run", *sys.argv[1:]]
runpy.run_module("harness.run", run_name="__main__")
"""


def test_the_entry_point_exits_after_its_summary_although_tool_calls_hung(tmp_path):
    """``python -m harness.run ... tools=calculator`` with a calculator whose every call hangs
    (``tools.timeout_s=0.05``): the run finishes, prints its summary and exits with rc 0 within
    30 s of it (before the fix it never exited)."""
    args = ["model=tiny", "task=arith", "tools=calculator", "tools.call_open=", "tools.call_close=e",
            "tools.timeout_s=0.05", "train.steps=1", "train.prompts_per_step=2", "group_size=2",
            "rollout.max_new_tokens=16", "eval.size=2", "eval.every=1", "rollout.progress=false",
            f"train.threads={job_threads()}", f"checkpoint.dir={tmp_path}/ckpt",
            f"tracking.uri=sqlite:///{tmp_path}/mlflow.db", f"hydra.run.dir={tmp_path}/out"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _HANGING_RUN, *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, summary_at = [], None
    try:
        for line in proc.stdout:
            lines.append(line)
            if "== grpo-harness summary ==" in line:
                summary_at = time.perf_counter()
                break
        assert summary_at is not None, "".join(lines[-40:])
        rest = proc.communicate(timeout=30)[0]  # the exit, after the summary
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(lines[-40:]) + rest[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.search_runs([client.get_experiment_by_name("grpo-harness").experiment_id])[0]
    errors = client.get_metric_history(run.info.run_id, "rollout/tool_errors")
    assert errors and max(m.value for m in errors) > 0  # calls were made, and timed out
