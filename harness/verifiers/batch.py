"""Batch verification API used by the trainer: ``verify_batch``, ``summarize`` and the verifier
kinds, registered in :data:`VERIFIERS` (:mod:`harness.registry`) with their params beside them.

* ``"gsm8k"`` and ``"int"`` are regex + exact-fraction checks (linear time, no evaluation of
  model text); they run inline in the calling thread.
* ``"math"`` extracts the boxed answer inline (linear scan) and sends (answer, gold) pairs to
  a lazily created, module-level pool of worker processes (:mod:`harness.verifiers._pool`),
  reused across calls and shut down ``atexit``. Each item has its own deadline counted from
  dispatch; a worker that exceeds it is killed and replaced and the item is reported as
  ``status="timeout"``. Any other failure is ``status="error"``. Calls work from any thread
  (no signals are used); concurrent calls are serialised.
"""

from __future__ import annotations

import atexit
import os
import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from harness.registry import Registry
from harness.verifiers import numeric
from harness.verifiers._pool import WorkerPool
from harness.verifiers.math import _MAX_ANSWER_CHARS, extract_boxed

__all__ = ["VERIFIERS", "MathVerifyParams", "Verdict", "math_correct", "shutdown_pool", "summarize", "verify_batch"]

# kind -> fn(completions, golds, params) -> list[Verdict]; a task names its kind (Task.verifier_kind)
VERIFIERS: Registry = Registry("verifier kind")


@dataclass
class Verdict:
    """Outcome of verifying one completion.

    Attributes:
        correct: the answer matches the gold (always False unless ``status == "ok"``).
        formatted: the expected answer format was present (``#### N`` or ``\\boxed{}``).
        extracted: the extracted answer text, or None.
        status: ``"ok"``, ``"timeout"`` (deadline exceeded) or ``"error"`` (exception).
        detail: short reason for ``"error"`` (empty otherwise); for logs only.
    """

    correct: bool
    formatted: bool
    extracted: str | None
    status: str
    detail: str = ""


def _inline_numeric(check: Callable[[str, str], bool]) -> Callable[[list, list, None], list[Verdict]]:
    """A batch verifier running ``check`` inline on each item; a failing item is ``status="error"``."""

    def run(completions: list[str], golds: list[str], params: None = None) -> list[Verdict]:
        out = []
        for c, g in zip(completions, golds):
            try:
                extracted, formatted = numeric.extract_gsm8k_answer(c), numeric.has_gsm8k_format(c)
                out.append(Verdict(bool(check(c, g)), formatted, extracted, "ok"))
            except Exception as exc:  # noqa: BLE001 - a bad item must not kill the batch
                extracted = None
                try:
                    extracted = numeric.extract_gsm8k_answer(c)
                except Exception:  # noqa: BLE001
                    pass
                detail = f"{type(exc).__name__}: {exc}"[:200]
                out.append(Verdict(False, numeric.has_gsm8k_format(c), extracted, "error", detail))
        return out

    return run


VERIFIERS.register("gsm8k")(_inline_numeric(numeric.gsm8k_correct))
VERIFIERS.register("int")(_inline_numeric(numeric.int_correct))

_pool: WorkerPool | None = None
_pool_guard = threading.Lock()


def _get_pool() -> WorkerPool:
    """The module-level pool, created on first use (and again in a forked child)."""
    global _pool
    with _pool_guard:
        if _pool is None or _pool.pid != os.getpid() or _pool.closed:
            _pool = WorkerPool()
        return _pool


def shutdown_pool() -> None:
    """Stop the worker processes (registered with ``atexit``; safe to call any time).

    A later ``verify_batch("math", ...)`` starts a fresh pool.
    """
    global _pool
    with _pool_guard:
        pool, _pool = _pool, None
    if pool is not None and pool.pid == os.getpid():
        pool.shutdown()


atexit.register(shutdown_pool)


def _math_job(answer: str, gold: str) -> dict:
    """Worker request for one MATH item (tests monkeypatch this to inject slow items)."""
    return {"op": "math", "pred": answer, "gold": gold}


@dataclass
class MathVerifyParams:
    """The ``math`` kind's bounds (a MATH task passes ``task.verify_timeout_s`` / ``task.verify_workers``).

    ``timeout_s``: per-item deadline in seconds, counted from dispatch to a worker; the whole
    batch is also bounded: items still undispatched after ``ceil(n / num_workers) * timeout_s + 15``
    seconds are reported as timeouts. ``num_workers``: worker processes used in parallel.
    """

    timeout_s: float = 5.0
    num_workers: int = 2


@VERIFIERS.register("math", params=MathVerifyParams)
def _verify_math(completions: list[str], golds: list[str], p: MathVerifyParams) -> list[Verdict]:
    """Last ``\\boxed{}`` vs gold via math_verify (:mod:`.math`), in the worker pool."""
    if not p.timeout_s > 0 or p.num_workers < 1:
        raise ValueError("timeout_s must be > 0 and num_workers >= 1")
    timeout_s, num_workers = float(p.timeout_s), int(p.num_workers)
    verdicts: list[Verdict | None] = [None] * len(completions)
    jobs: list[dict] = []
    where: list[int] = []
    answers: list[str | None] = [None] * len(completions)
    for i, (c, g) in enumerate(zip(completions, golds)):
        try:
            if not isinstance(g, str):
                raise TypeError(f"gold must be str, got {type(g).__name__}")
            answer = answers[i] = extract_boxed(c)
        except Exception as exc:  # noqa: BLE001
            verdicts[i] = Verdict(False, False, None, "error", f"{type(exc).__name__}: {exc}"[:200])
            continue
        if not answer or len(answer) > _MAX_ANSWER_CHARS:
            verdicts[i] = Verdict(False, answer is not None and answer != "", answer, "ok")
            continue
        jobs.append(_math_job(answer, g))
        where.append(i)
    if jobs:
        try:
            replies = _get_pool().run(jobs, timeout_s, num_workers)
        except Exception as exc:  # noqa: BLE001 - e.g. pool shut down by another thread
            replies = [{"ok": False, "error": f"{type(exc).__name__}: {exc}"}] * len(jobs)
        for i, reply in zip(where, replies):
            answer = answers[i]
            if reply.get("ok"):
                verdicts[i] = Verdict(bool(reply.get("correct")), True, answer, "ok")
            elif reply.get("timeout"):
                verdicts[i] = Verdict(False, True, answer, "timeout")
            else:
                verdicts[i] = Verdict(False, True, answer, "error", str(reply.get("error", ""))[:200])
    return verdicts  # type: ignore[return-value]


def verify_batch(kind: str, completions: list[str], golds: list[str], **params) -> list[Verdict]:
    """Verify a batch of completions against their gold answers.

    Args:
        kind: a registered verifier kind (:data:`VERIFIERS`): ``"gsm8k"`` (number after ``####``,
            see :mod:`.numeric`), ``"int"`` (same, integer gold) or ``"math"`` (last ``\\boxed{}``
            vs gold via math_verify, see :mod:`.math`).
        completions: model completions.
        golds: gold answers, same length (GSM8K: bare number or full ``answer`` field).
        params: the kind's params (``math``: :class:`MathVerifyParams`, ``timeout_s`` and
            ``num_workers``; the inline kinds are linear-time and take none).

    Returns:
        One :class:`Verdict` per completion, in order. Timeouts and exceptions (including a
        malformed gold) become ``correct=False`` with ``status`` ``"timeout"``/``"error"``;
        this function never hangs.

    Raises:
        ValueError: unknown ``kind`` (the message lists the valid names), length mismatch,
            a parameter the kind does not take, or ``timeout_s``/``num_workers`` not positive.
    """
    spec = VERIFIERS.spec(kind)
    if len(completions) != len(golds):
        raise ValueError(f"{len(completions)} completions but {len(golds)} golds")
    return spec.fn(list(completions), list(golds), spec.build(params))


def math_correct(completion: str, gold: str, *, timeout_s: float = MathVerifyParams.timeout_s) -> bool:
    """Check a MATH completion against the gold answer, bounded in time from any thread.

    Args:
        completion: the model completion; its last ``\\boxed{}`` is the answer.
        gold: the gold answer string (MATH ``answer`` field).
        timeout_s: deadline for the equivalence check; runs in the shared worker pool of
            :mod:`harness.verifiers.batch`.

    Returns:
        False when there is no box, on timeout or on any error; else
        :func:`harness.verifiers.math.answers_equivalent`.
    """
    return verify_batch("math", [completion], [gold], timeout_s=timeout_s, num_workers=1)[0].correct


def summarize(verdicts: Iterable[Verdict]) -> dict[str, float]:
    """Aggregate verdicts into logging metrics.

    Args:
        verdicts: verdicts of one or more batches.

    Returns:
        ``{"verifier/n", "verifier/correct", "verifier/accuracy", "verifier/format_rate",
        "verifier/timeouts", "verifier/errors"}`` (counts as floats; rates 0.0 when empty).
    """
    vs = list(verdicts)
    n = len(vs)
    correct = sum(v.correct for v in vs)
    return {
        "verifier/n": float(n),
        "verifier/correct": float(correct),
        "verifier/accuracy": correct / n if n else 0.0,
        "verifier/format_rate": sum(v.formatted for v in vs) / n if n else 0.0,
        "verifier/timeouts": float(sum(v.status == "timeout" for v in vs)),
        "verifier/errors": float(sum(v.status == "error" for v in vs)),
    }
