"""A small pool of verifier worker processes with per-item deadlines.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot kill one stuck task (a sympy
call inside C code ignores everything but SIGKILL), and a killed worker breaks the whole
executor. Why not ``multiprocessing`` spawn/forkserver: spawn re-imports the trainer's
``__main__`` module (which imports torch) in every worker, forkserver imports it in its
server by default and its preload list is process-global state shared with other code.
Each worker here is a plain ``subprocess`` running ``python -m harness.verifiers._worker``
and speaking JSON lines over its stdin/stdout, so it can be killed and replaced on its own,
imports only the verifier stack, and works the same from any thread. Batches from different
threads are serialised by a lock.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

STARTUP_TIMEOUT_S = 60.0  # a fresh worker must report ready within this
BATCH_SLACK_S = 15.0  # allowance for worker (re)starts on top of the per-item deadlines
MAX_START_FAILURES = 3  # consecutive failed starts before a batch gives up (status "error")

_REPO_ROOT = str(Path(__file__).resolve().parents[2])


class _Worker:
    """One worker subprocess plus its read buffer and state."""

    def __init__(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.verifiers._worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.fd = self.proc.stdout.fileno()  # type: ignore[union-attr]
        os.set_blocking(self.fd, False)
        self.buf = b""
        self.ready = False
        self.started = time.monotonic()
        self.job: int | None = None  # index of the in-flight job
        self.deadline = 0.0

    def send(self, obj: dict) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(obj).encode("utf-8") + b"\n")
        self.proc.stdin.flush()

    def read_lines(self) -> tuple[list[dict], bool]:
        """Drain readable bytes; return parsed messages and whether EOF was reached."""
        eof = False
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            self.buf += chunk
        msgs = []
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            try:
                msgs.append(json.loads(line))
            except ValueError:
                msgs.append({"ok": False, "error": "unreadable worker reply"})
        return msgs, eof

    def kill(self) -> None:
        try:
            self.proc.kill()
        except OSError:
            pass
        self._close()
        try:
            self.proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, OSError):
            pass

    def close(self, grace_s: float = 1.0) -> None:
        """Ask politely (stdin EOF), then kill."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=grace_s)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            self.kill()
        self._close()

    def _close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f:
                    f.close()
            except OSError:
                pass


class WorkerPool:
    """Reusable pool; ``run`` executes a list of requests with a per-item deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self.pid = os.getpid()
        self.closed = False

    def run(self, jobs: list[dict], timeout_s: float, num_workers: int) -> list[dict]:
        """Run ``jobs`` (worker requests) in parallel; one reply dict per job, in order.

        A reply is the worker's ``{"ok": True, ...}`` / ``{"ok": False, "error": ...}``, or
        ``{"ok": False, "timeout": True}`` when the item exceeded ``timeout_s`` seconds after
        dispatch (its worker is killed and replaced) or was still waiting when the batch
        budget ``timeout_s * ceil(len(jobs) / num_workers) + BATCH_SLACK_S`` ran out.
        Never raises for worker failures.
        """
        if not jobs:
            return []
        with self._lock:
            if self.closed:
                raise RuntimeError("verifier pool is shut down")
            return self._run_locked(jobs, timeout_s, max(1, min(num_workers, len(jobs))))

    def _run_locked(self, jobs: list[dict], timeout_s: float, n: int) -> list[dict]:
        # whole-batch budget: items not dispatched by then are reported as timeouts, so a
        # batch full of slow items cannot take len(jobs) * (timeout + worker restart)
        batch_deadline = time.monotonic() + timeout_s * math.ceil(len(jobs) / n) + BATCH_SLACK_S
        self._workers = [w for w in self._workers if w.proc.poll() is None]
        while len(self._workers) < n:
            self._workers.append(_Worker())
        batch = _Batch(self._workers, jobs, timeout_s, n, batch_deadline)
        try:
            batch.run()
        finally:
            batch.sel.close()
        return batch.replies()

    def shutdown(self) -> None:
        """Stop all workers (idempotent)."""
        got = self._lock.acquire(timeout=10.0)  # a daemon thread may hold it at exit
        try:
            self.closed = True
            workers, self._workers = self._workers, []
        finally:
            if got:
                self._lock.release()
        for w in workers:
            w.close()


class _Batch:
    """One :meth:`WorkerPool.run`: the queue of jobs, their replies, and the ``n`` workers it uses
    (a dead or late worker is replaced in the pool's list too)."""

    def __init__(self, workers: list[_Worker], jobs: list[dict], timeout_s: float, n: int, deadline: float):
        self.workers, self.active = workers, workers[:n]
        self.jobs, self.timeout_s, self.deadline = jobs, timeout_s, deadline
        self.results: list[dict | None] = [None] * len(jobs)
        self.pending = deque(range(len(jobs)))
        self.start_failures = 0
        self.sel = selectors.DefaultSelector()
        for w in self.active:
            self.sel.register(w.fd, selectors.EVENT_READ, w)

    def run(self) -> None:
        """Dispatch, read replies and enforce the deadlines until every job has a reply (or the
        workers cannot start)."""
        while self.pending or any(w.job is not None for w in self.active):
            self._dispatch()
            self._read()
            now = time.monotonic()
            self._expire(now)
            if self.start_failures >= MAX_START_FAILURES and not any(w.ready for w in self.active):
                break
            if now > self.deadline:
                while self.pending:
                    self.results[self.pending.popleft()] = {"ok": False, "timeout": True}

    def replies(self) -> list[dict]:
        """One reply per job, in order (``verifier workers failed to start`` where none came)."""
        return [r if r is not None else {"ok": False, "error": "verifier workers failed to start"}
                for r in self.results]

    def _replace(self, w: _Worker) -> None:
        self.sel.unregister(w.fd)
        w.kill()
        new = _Worker()
        self.workers[self.workers.index(w)] = new
        self.active[self.active.index(w)] = new
        self.sel.register(new.fd, selectors.EVENT_READ, new)

    def _dispatch(self) -> None:
        for w in self.active:
            if w.ready and w.job is None and self.pending:
                idx = self.pending.popleft()
                try:
                    w.send(self.jobs[idx])
                    w.job, w.deadline = idx, time.monotonic() + self.timeout_s
                except (OSError, ValueError):
                    self.pending.appendleft(idx)
                    self._replace(w)

    def _read(self) -> None:
        """Wait for replies until the nearest deadline (at most 1 s) and take what came."""
        waits = [w.deadline for w in self.active if w.job is not None]
        waits += [w.started + STARTUP_TIMEOUT_S for w in self.active if not w.ready]
        wait_s = max(0.0, min(waits) - time.monotonic()) if waits else 0.05
        for key, _ in self.sel.select(timeout=min(wait_s, 1.0) + 0.001):
            w = key.data
            msgs, eof = w.read_lines()
            read_at = time.monotonic()
            for msg in msgs:
                if msg.get("ready"):
                    w.ready, self.start_failures = True, 0
                elif w.job is not None:
                    # a reply read after its deadline is a timeout, as if it had not come:
                    # the deadline must not depend on how long select() happened to wait
                    late = read_at > w.deadline
                    self.results[w.job], w.job = ({"ok": False, "timeout": True} if late else msg), None
            if eof:
                if w.job is not None:
                    self.results[w.job] = {"ok": False, "error": "worker died"}
                    w.job = None
                elif not w.ready:
                    self.start_failures += 1
                self._replace(w)

    def _expire(self, now: float) -> None:
        """A job past its deadline is a timeout and a worker that did not start in time is a
        start failure: either worker is replaced."""
        for w in list(self.active):
            if w.job is not None and now > w.deadline:
                self.results[w.job] = {"ok": False, "timeout": True}
                w.job = None
                self._replace(w)
            elif not w.ready and now > w.started + STARTUP_TIMEOUT_S:
                self.start_failures += 1
                self._replace(w)
