"""Progress a reader can follow from a redirected log: plain, rate-limited lines per phase, one line
per step with the phase split, the step-0 eval as soon as it is done, and a job's name on every
line of a multirun job or a sweep trial (:mod:`harness.progress`)."""

from __future__ import annotations

import io
import logging
import re

import pytest

from harness import progress


@pytest.fixture
def plain(monkeypatch):
    """Plain lines (as when stderr is redirected), progress on; the module state restored after."""
    monkeypatch.setattr(progress, "_state", {"enabled": True, "plain": True, "phase": "", "step": ""})
    return progress


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "harness.progress"]


def test_plain_lines_name_step_phase_count_and_time(plain, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)  # every update says a line
    progress.set_step(3, 10)
    with progress.phase("rollout"):
        with progress.bar(32, "completions") as bar:
            bar.update(12)
            bar.update(20)
    lines = _lines(caplog)  # closing adds no line: the last one had the final count
    assert len(lines) == 2 and re.fullmatch(r"step 3/10 rollout 12/32 completions, \d+ s", lines[0]), lines
    assert re.fullmatch(r"step 3/10 rollout 32/32 completions, \d+ s", lines[1]), lines
    assert not any("\r" in x for x in lines)


def test_plain_lines_are_rate_limited_and_silent_for_a_short_phase(plain, caplog):
    caplog.set_level(logging.INFO)
    with progress.phase("update"):
        with progress.bar(4, "micro-batch") as bar:  # INTERVAL_S = 30 s: a phase of milliseconds says nothing
            for _ in range(4):
                bar.update(1)
    assert _lines(caplog) == []
    with progress.bar(4, "tok") as bar:  # refreshes forced as tqdm's monitor thread does: one line per 30 s
        bar.update(1)
        for _ in range(3):
            bar.refresh()
        bar.update(1)
    assert [re.sub(r"\d+ s", "t", x) for x in _lines(caplog)] == ["1/4 tok, t", "2/4 tok, t (done)"], _lines(caplog)


def test_rollout_progress_false_silences_the_bars(plain, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    progress.configure(False)
    with progress.bar(2, "tok") as bar:
        bar.update(2)
    assert _lines(caplog) == []


def test_job_prefix_marks_every_line_then_restores_the_formatters():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    before = handler.formatter
    try:
        with progress.job_prefix("trial 3"):
            logging.getLogger("harness.train.trainer").warning("step 1/2 reward 0.250")
            assert progress.prefixed("== summary ==\nMLflow run : x") == "[trial 3] == summary ==\n[trial 3] MLflow run : x"
        logging.getLogger("harness.train.trainer").warning("after")
        assert progress.prefixed("a\nb") == "a\nb"
    finally:
        root.removeHandler(handler)
    assert stream.getvalue().splitlines() == ["[trial 3] WARNING step 1/2 reward 0.250", "WARNING after"]
    assert handler.formatter is before


def test_a_run_logs_the_step0_eval_each_step_split_and_phase_lines(run_dir, caplog, monkeypatch):
    """A tiny run with progress on and plain lines every update: the step-0 eval line comes before
    step 1's lines, each step's line splits its time by phase (read from the time/* metrics), and
    the rollout, reference log-prob, update and eval phases each report."""
    from tests.conftest import run_job

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    monkeypatch.setattr(progress, "_state", {"enabled": True, "plain": True, "phase": "", "step": ""})
    run_job(f"checkpoint.dir={run_dir}/ck", "rollout.progress=true", "beta=0.1")
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("harness")]
    first = next(i for i, m in enumerate(msgs) if m.startswith("step 0/2 eval_acc"))
    assert re.match(r"step 0/2 eval_acc \d\.\d{3} format \d\.\d{3} \(\d+\.\d s\)$", msgs[first]), msgs[first]
    assert all(not m.startswith("step 1/2 rollout") for m in msgs[:first]), "the step-0 eval line came late"
    steps = [m for m in msgs if re.match(r"step [12]/2 reward", m)]
    assert len(steps) == 2, steps
    for m in steps:  # eval.every=1: every step evaluates
        assert re.search(r"eval_acc \d\.\d{3} format \d\.\d{3} \| \d+\.\d s: rollout \d+\.\d, reward \d+\.\d, "
                         r"log-probs \d+\.\d, update \d+\.\d, eval \d+\.\d$", m), m
    for phase in ("step 1/2 rollout (8 seqs)", "step 1/2 reference log-probs", "step 1/2 update",
                  "step 2/2 eval (4 seqs)", "step 2/2 eval "):
        assert any(m.startswith(phase) for m in msgs), (phase, [m for m in msgs if m.startswith("step")])
    assert not any("\r" in m for m in msgs)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_library_bars_show_only_where_ours_are_bars(plain, monkeypatch):
    """transformers' and huggingface_hub's loading bars and datasets' split bars: hidden in a
    redirected log (plain lines) and with rollout.progress=false, shown on a terminal."""
    import datasets
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as tlog

    def shown() -> tuple:
        return (tlog.is_progress_bar_enabled(), not hub_utils.are_progress_bars_disabled(),
                datasets.is_progress_bar_enabled())

    try:
        progress.library_bars(True)  # plain lines: their \r redraws would land in the log
        assert shown() == (False, False, False)
        monkeypatch.setitem(progress._state, "plain", False)
        monkeypatch.setattr(progress.sys, "stderr", _Terminal())
        progress.library_bars(True)
        assert shown() == (True, True, True)
        progress.library_bars(False)
        assert shown() == (False, False, False)
    finally:
        tlog.enable_progress_bar()
        hub_utils.enable_progress_bars()
        datasets.enable_progress_bars()


def test_a_library_module_tqdm_writes_plain_lines_in_the_block_only(plain, caplog, monkeypatch):
    """A bar a library draws with its own module-level tqdm (transformers' GGUF conversion) becomes
    plain log lines inside progress.library_tqdm, nothing with progress off, and is the library's
    own again after the block."""
    import types

    from tqdm.std import tqdm as std_tqdm

    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    lib = types.SimpleNamespace(tqdm=std_tqdm)

    def convert():  # what the library does
        return sum(1 for _ in lib.tqdm(range(3), desc="Converting tensors"))

    with progress.library_tqdm(lib):
        assert lib.tqdm is progress.LogLines
        assert convert() == 3
    assert lib.tqdm is std_tqdm
    lines = _lines(caplog)
    assert lines and all(re.fullmatch(r"Converting tensors \d/3 it, \d+ s( \(done\))?", x) for x in lines), lines
    caplog.clear()
    progress.configure(False)
    with progress.library_tqdm(lib):
        assert convert() == 3
    assert _lines(caplog) == []


def test_vllm_bar_class_writes_plain_lines(plain, caplog, monkeypatch):
    """The class given to vLLM's use_tqdm, called as vLLM's engine loop calls it, writes log lines
    (no \\r); with progress off it is False (vLLM then draws nothing)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)
    progress.set_step(2, 5)
    make = progress.tqdm_class()
    pbar = make(total=4, desc="Processed prompts", dynamic_ncols=True,
                postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
    assert isinstance(pbar, progress.LogLines)
    pbar.update(4)
    pbar.close()
    lines = _lines(caplog)
    assert lines and re.fullmatch(r"step 2/5 Processed prompts 4/4 it, \d+ s", lines[0]), lines
    assert not any("\r" in x for x in lines)
    progress.configure(False)
    assert progress.tqdm_class() is False
