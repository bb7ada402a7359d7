"""The tool interface: a call's text in, a bounded observation text out.

A tool is a class registered in :data:`TOOLS` with its params dataclass (:class:`ToolConfig` or a
subclass, the ``tools=<name>`` config node), built as ``cls(params)``; calling it with the text
between the call tags returns the result text. :class:`ToolRunner` wraps every call with the
guarantees the episode rollout (:mod:`harness.rollout.episode`) relies on: a call that raises,
runs past ``timeout_s`` or returns more than ``max_output_chars`` characters yields a short error
observation instead, and is counted as a tool error; the run goes on.

``tools=none`` (the default) registers no tool: the rollout is the single-turn one, unchanged.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from dataclasses import dataclass

from harness.registry import Registry

# name -> tool class, with its ToolConfig (sub)class as params; ``tools=<name>`` picks one
TOOLS: Registry = Registry("tool")

MAX_ERROR_CHARS = 120  # an error observation's message is cut to this many characters


@dataclass
class NoToolConfig:
    """``tools=none``: no tool, single-turn rollouts (today's runs, unchanged)."""

    name: str = "none"


@dataclass
class ToolConfig:
    """The fields every tool has (a tool's params subclass it): the call format (``format=tags``: the
    model writes ``call_open`` + input + ``call_close``; generation stops at ``call_close`` and the
    harness appends ``result_open`` + output + ``result_close``; ``format=chat_template``: the
    tokenizer's chat template's tool messages and hermes ``<tool_call>`` JSON, the four tags unused,
    see :mod:`harness.tools.formats`) and the bounds on one call.
    """

    name: str = ""  # each registered tool's own name
    format: str = "tags"  # tags | chat_template (harness.tools.formats)
    call_open: str = "<calc>"
    call_close: str = "</calc>"  # the stop string of a turn
    result_open: str = "<result>"
    result_close: str = "</result>"
    max_input_chars: int = 200  # longer call inputs are refused (error observation)
    max_output_chars: int = 400  # longer outputs are replaced by an error observation
    timeout_s: float = 2.0  # a call running longer yields an error observation (its thread is abandoned)


@TOOLS.register("none", params=NoToolConfig)
class NoTool:
    """Placeholder of ``tools=none``: never built into a rollout (:func:`harness.tools.build_tool` returns None)."""

    def __init__(self, params: NoToolConfig):
        self.params = params


@dataclass
class Observation:
    """One call's outcome: ``text`` (what goes between the result tags, bounded) and ``error``
    (True when the tool refused the input, raised, timed out or returned too much)."""

    text: str
    error: bool


class ToolError(Exception):
    """Raised by a tool for input it refuses; its message becomes the error observation."""


class _Worker:
    """One daemon thread running a tool's calls from a queue, one at a time.

    Not a :class:`concurrent.futures.ThreadPoolExecutor`: its workers are joined at interpreter
    exit (``concurrent.futures.thread._python_exit``), so a call that never returns, abandoned after
    its timeout, kept a finished run's process from ever exiting. A daemon thread is not joined.
    """

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name="tool", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, arg, future = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(arg))
                except BaseException as e:  # noqa: BLE001 - handed to the caller through the future
                    future.set_exception(e)

    def submit(self, fn, arg) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((fn, arg, future))
        return future

    def stop(self) -> None:
        """The thread ends after its current call (never, for a call that hangs: it is a daemon)."""
        self.jobs.put(None)


class ToolRunner:
    """Runs a tool's calls under the bounds of its params (``max_input_chars``, ``timeout_s``,
    ``max_output_chars``) and formats the observation text.

    Calls run on one daemon worker thread (:class:`_Worker`); a call past ``timeout_s`` is abandoned
    with its thread, and the next call starts a fresh one. :meth:`close` stops the worker; a hung
    call never blocks the interpreter's exit.

    Args:
        tool: a built tool (callable ``str -> str``; raises :class:`ToolError` on bad input).
        params: its :class:`ToolConfig`.
    """

    def __init__(self, tool, params: ToolConfig):
        self.tool, self.params = tool, params
        self._worker: _Worker | None = None  # started by the first call

    def observe(self, call: str) -> Observation:
        """The observation of one call (never raises; the text has at most
        ``max(max_output_chars, MAX_ERROR_CHARS + 7)`` characters)."""
        p = self.params
        if len(call) > p.max_input_chars:
            return Observation(f"error: input longer than {p.max_input_chars} characters", True)
        if self._worker is None:
            self._worker = _Worker()
        future = self._worker.submit(self.tool, call)
        try:
            out = future.result(timeout=p.timeout_s)
        except concurrent.futures.TimeoutError:
            # a Python thread cannot be killed: abandon it (a daemon) and give later calls a fresh worker
            self.close()
            return Observation(f"error: timed out after {p.timeout_s:g} s", True)
        except Exception as e:  # noqa: BLE001 - any failure of the tool is an error observation
            return Observation(("error: " + (str(e) or type(e).__name__))[: MAX_ERROR_CHARS + 7], True)
        out = str(out)
        if len(out) > p.max_output_chars:
            return Observation(f"error: output longer than {p.max_output_chars} characters", True)
        return Observation(out, False)

    def close(self) -> None:
        """Stop the worker thread (idempotent; a later call starts a new one). Returns at once,
        even while a call hangs."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def schema(self) -> dict | None:
        """The tool's JSON schema (OpenAI function-calling style, what ``apply_chat_template(...,
        tools=[schema])`` renders), or None for a tool without one."""
        return self.tool.schema() if hasattr(self.tool, "schema") else None

    def error(self, message: str) -> Observation:
        """An error observation with ``message`` (cut to ``MAX_ERROR_CHARS``)."""
        return Observation(("error: " + message)[: MAX_ERROR_CHARS + 7], True)

    def wrap(self, obs: Observation) -> str:
        """The observation's text between the result tags (what is tokenized and appended)."""
        return f"{self.params.result_open}{obs.text}{self.params.result_close}"
