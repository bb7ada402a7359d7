"""Verifier worker process: ``python -m harness.verifiers._worker``.

Protocol (one JSON object per line, UTF-8):

* worker -> parent, once at start-up after the heavy imports: ``{"ready": true}``
* parent -> worker: ``{"op": "math", "pred": str, "gold": str}``
  (test hooks: ``{"op": "sleep", "seconds": float}``, ``{"op": "exit"}`` (dies abruptly),
  ``{"op": "raise"}``)
* worker -> parent: ``{"ok": true, "correct": bool}`` or ``{"ok": false, "error": str}``

The worker exits when its stdin reaches EOF (the parent closed it or died). It ignores SIGINT
so that a Ctrl-C in the trainer does not kill the pool mid-batch; the parent's ``atexit``
hook and stdin EOF end it. An address-space limit (``HARNESS_VERIFIER_MEM_MB``, default 3072)
turns runaway sympy allocations into a ``MemoryError`` -> ``status="error"`` instead of
swapping the host. The parent enforces the per-item deadline by killing the process.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import signal
import sys
import time

from harness.verifiers.math import answers_equivalent  # light: math_verify/sympy load at the warm-up call


def _limit_memory() -> None:
    try:
        mb = int(os.environ.get("HARNESS_VERIFIER_MEM_MB", "3072"))
        if mb > 0:
            limit = mb * 1024 * 1024
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ValueError, OSError):
        pass


def _handle(req: dict) -> dict:
    op = req.get("op")
    if op == "math":
        return {"ok": True, "correct": bool(answers_equivalent(req["pred"], req["gold"]))}
    if op == "sleep":
        time.sleep(float(req["seconds"]))
        return {"ok": True, "correct": False}
    if op == "exit":
        os._exit(3)
    if op == "raise":
        raise RuntimeError("test hook: deliberate error")
    return {"ok": False, "error": f"unknown op {op!r}"}


def main() -> None:
    """Serve verification requests on stdin/stdout until EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Keep the protocol channel private: anything a library prints goes to stderr.
    proto_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    _limit_memory()
    answers_equivalent("\\frac{1}{2}", "0.5")  # warm-up: imports sympy/antlr, builds regexes

    def send(obj: dict) -> None:
        proto_out.write(json.dumps(obj).encode("utf-8") + b"\n")

    send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            reply = _handle(req)
        except MemoryError:
            reply = {"ok": False, "error": "MemoryError"}
        except Exception as exc:  # noqa: BLE001 - every failure becomes status="error"
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
        send(reply)


if __name__ == "__main__":
    main()
