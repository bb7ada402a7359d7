"""Progress reporting of a run's phases (rollout, reference / old log-probs, update micro-batches,
eval), whether or not the output is a terminal.

* On a terminal: tqdm bars, one per phase, cleared when the phase ends.
* Otherwise (a redirected log, a multirun or sweep job): :class:`LogLines`, a tqdm that writes a
  plain log line at most every :data:`INTERVAL_S` seconds instead of redrawing a bar, e.g.
  ``step 3/10 rollout (32 seqs) 64/128 tok, 41 s``, and a last line when a phase that took longer
  than that ends.
* :func:`job_prefix` puts a job's name in front of every log line while the job runs (a Hydra
  multirun job, a sweep trial), so the lines of parallel jobs can be told apart.

``rollout.progress`` is the only switch (:func:`configure`). The trainer names the phase and the
step (:func:`phase`, :func:`set_step`); the loops that do the work open a :func:`bar`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
from unittest import mock

from huggingface_hub import utils as hub_utils
from tqdm.std import tqdm
from transformers.utils import logging as transformers_logging

log = logging.getLogger("harness.progress")

INTERVAL_S = 30.0
"""Seconds between two plain lines of one phase (a redirected log)."""

_state = {"enabled": True, "plain": False, "phase": "", "step": "", "job": None}


def configure(enabled: bool) -> None:
    """``enabled``: ``rollout.progress`` (and rank 0: the other ranks report nothing)."""
    _state["enabled"] = bool(enabled)


def set_step(step: int, total: int) -> None:
    """The step being computed, named in every plain line (``step 3/10``; 0/total: the step-0 eval)."""
    _state["step"] = f"step {step}/{total}"


@contextlib.contextmanager
def phase(name: str):
    """Name the phase the bars opened inside this block belong to (``rollout``, ``eval``, ...)."""
    before = _state["phase"]
    _state["phase"] = name
    try:
        yield
    finally:
        _state["phase"] = before


def current_phase() -> str:
    return _state["phase"]


class _Discard:
    """A file that drops what tqdm would draw (LogLines says it through logging instead)."""

    def write(self, s) -> int:
        return len(s)

    def flush(self) -> None:
        pass


class LogLines(tqdm):
    """A tqdm whose display is a log line: at most one every ``mininterval`` seconds while it runs
    (none at the start), and one marked ``(done)`` when it closes, if it printed any and the
    count moved since."""

    monitor_interval = 0  # no tqdm monitor thread of our own

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("mininterval", INTERVAL_S)
        kwargs["maxinterval"] = max(kwargs["mininterval"], 10.0)
        kwargs["file"] = _Discard()
        self._printed, self._said_at, self._said_n = False, None, None
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        closing = self.disable  # tqdm.close() sets disable before its last display
        if (self.n == 0 and not closing) or (closing and (not self._printed or self.n == self._said_n)):
            return True  # nothing done yet; a short phase; the last line already had the final count
        now = self._time()
        # tqdm's monitor thread (started by any other bar, e.g. transformers') refreshes every
        # maxinterval: the rate limit is kept here
        if not closing and self._said_at is not None and now - self._said_at < self.mininterval:
            return True
        self._said_at, self._said_n = now, self.n
        d = self.format_dict
        total = f"/{d['total']}" if d["total"] else ""
        what = " ".join(x for x in (_state["step"], self.desc, f"{d['n']}{total} {d['unit']}") if x)
        log.info("%s, %.0f s%s", what, d["elapsed"], " (done)" if closing else "")
        self._printed = True
        return True


def _plain() -> bool:
    """Plain lines: inside :func:`job_prefix`, or when stderr is not a terminal."""
    return _state["plain"] or not sys.stderr.isatty()


def bar(total: int | None, unit: str, desc: str | None = None, disable: bool = False) -> tqdm:
    """A progress bar over ``total`` units of the current phase (``desc`` defaults to its name):
    a tqdm bar on a terminal, :class:`LogLines` otherwise; disabled by ``rollout.progress=false``."""
    kind = LogLines if _plain() else tqdm
    return kind(total=total, unit=unit, desc=desc if desc is not None else _state["phase"], leave=False,
                disable=disable or not _state["enabled"])


def plain() -> bool:
    """Whether progress is written as plain log lines (see :func:`bar`)."""
    return _plain()


def library_bars(enabled: bool) -> None:
    """Show or hide the libraries' own bars (transformers' and huggingface_hub's weight loading,
    datasets' "Generating train split"): shown only where ours are bars, i.e. ``enabled``
    (``rollout.progress``) and a terminal. In a redirected log their ``\r`` redraws would end up
    as one long line of carriage returns."""
    if enabled and not _plain():
        transformers_logging.enable_progress_bar()
        hub_utils.enable_progress_bars()
    else:
        transformers_logging.disable_progress_bar()
        hub_utils.disable_progress_bars()
    try:
        import datasets  # lazy: the GPU bundle leaves it out (its pyarrow is 55 MB); task=arith never loads it
    except ModuleNotFoundError:
        return
    (datasets.enable_progress_bars if enabled and not _plain() else datasets.disable_progress_bars)()


@contextlib.contextmanager
def library_tqdm(module):
    """Within the block, the bar that ``module`` draws with its own ``tqdm`` (one no library switch
    reaches, e.g. transformers' "Converting and de-quantizing GGUF tensors") is ours: plain
    :class:`LogLines` in a redirected log, tqdm on a terminal, nothing when progress is off.

    Raises:
        AttributeError: ``module`` has no module-level ``tqdm`` (the library moved it)."""
    if not _state["enabled"]:
        kind = functools.partial(tqdm, disable=True)
    elif _plain():
        kind = LogLines
    else:
        kind = tqdm
    with mock.patch.object(module, "tqdm", kind):
        yield


def tqdm_class():
    """What vLLM's ``LLM.generate(use_tqdm=...)`` takes: False when progress is off (or on ranks
    other than 0), else a bar class of this output: tqdm on a terminal, :class:`LogLines`
    otherwise (vLLM names its own bars, e.g. ``Processed prompts``)."""
    if not _state["enabled"]:
        return False
    return functools.partial(LogLines if _plain() else tqdm, leave=False)


class _Prefixed(logging.Formatter):
    """Another formatter's line with a prefix."""

    def __init__(self, prefix: str, inner: logging.Formatter | None):
        super().__init__()
        self.prefix, self.inner = prefix, inner or logging.Formatter()

    def format(self, record) -> str:
        return f"{self.prefix} {self.inner.format(record)}"


def prefixed(text: str) -> str:
    """``text`` with the current job's prefix on each line (for what a job prints, e.g. its summary)."""
    tag = _state.get("job")
    return "\n".join(f"{tag} {line}" for line in text.splitlines()) if tag else text


@contextlib.contextmanager
def job_prefix(name: str):
    """Prefix every line of the root logger's handlers with ``[name]`` inside this block (the
    handlers' formatters are wrapped, then restored). Plain lines are used meanwhile: bars of
    parallel jobs would overwrite each other."""
    handlers = list(logging.getLogger().handlers)
    before = [h.formatter for h in handlers]
    plain = _state["plain"]
    job = _state.get("job")
    for h in handlers:
        h.setFormatter(_Prefixed(f"[{name}]", h.formatter))
    _state["plain"], _state["job"] = True, f"[{name}]"
    try:
        yield
    finally:
        for h, f in zip(handlers, before):
            h.setFormatter(f)
        _state["plain"], _state["job"] = plain, job
