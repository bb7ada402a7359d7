"""Reuse of the step-0 eval across runs that start from the same weights (``eval.initial_cache``).

Every run of a study, a multirun or a sweep that starts from the same model evaluates the same
untrained weights on the same problems before its first step. That greedy eval is deterministic:
in the committed studies it gave the same ``eval/accuracy`` and ``eval/completion_len_mean`` in
every run of every arm and seed. At 250 arith problems it took as long as 4 training steps
(``docs/studies.md``, "Cheaper seeds"). With ``eval.initial_cache`` set to a folder, the first run
stores its step-0 eval there under a key, and a later run whose key matches replays it (the same
metrics, per-problem verdicts and sample table logged, ``on_eval`` called) instead of generating.

The key is a sha256 over everything the step-0 eval's output depends on (:func:`initial_eval_key`):
the policy's whole state dict (bytes), the rendered eval prompts and their golds, the resolved
``task``, ``model``, ``rollout`` and ``eval`` configs, ``train.precision``, the step-0 sampling seed
(used only when ``eval.num_samples`` > 0), the packages' versions, the harness's own source
files, the device, the CPU model and torch's thread count. Anything else that changes is a miss,
never a stale hit. Nothing here touches a random generator: a greedy eval consumes none, so a run
with the cache on trains exactly as one with it off (``tests/test_eval_cache.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch
from omegaconf import OmegaConf

from harness.model.digest import tensors_sha256
from harness.runtime.provenance import cpu_label, problems_sha256, versions

HARNESS_DIR = Path(__file__).resolve().parents[1]  # the harness package


def source_sha256(root: Path = HARNESS_DIR) -> str:
    """sha256 over the harness package's ``.py`` files (relative path and bytes, in path order), so a
    change to a verifier, a prompt or the eval code is a different key."""
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def initial_eval_key(cfg, policy, prompts: list[str], problems, seed: int) -> str:
    """The step-0 eval's cache key (hex sha256).

    Args:
        cfg: the run's composed config (``task``, ``model``, ``rollout``, ``eval``, ``train.precision``).
        policy: the policy module as it is evaluated at step 0 (its whole state dict is hashed: base
            weights, LoRA adapters and buffers).
        prompts: the eval prompts as rendered (chat template and system prompt included).
        problems: the eval problems (``id``, ``question``, ``gold``).
        seed: the step-0 eval's sampling seed (matters only when ``eval.num_samples`` > 0).
    """
    def resolved(node):
        return OmegaConf.to_container(node, resolve=True)

    parts = {
        "weights": tensors_sha256(policy.state_dict()),
        "prompts": hashlib.sha256(json.dumps(prompts).encode()).hexdigest(),
        "problems": problems_sha256(problems),
        "config": {k: resolved(cfg[k]) for k in ("task", "model", "rollout", "eval")},
        "precision": cfg.train.precision,
        "seed": seed if cfg.eval.num_samples > 0 else None,
        "versions": versions(),
        "source": source_sha256(),
        "device": str(next(policy.parameters()).device),
        "cpu": cpu_label(),  # model, family/model and the vector ISA torch's kernels use
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
    }
    parts["config"]["eval"].pop("initial_cache", None)  # where the cache lives is not what it holds
    parts["config"]["eval"].pop("every", None)  # when later evals run does not change step 0's
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def load(folder: str | Path, key: str) -> dict | None:
    """The stored step-0 eval of ``key`` (``metrics``, ``rows``, ``correct``, ``lengths``), or None
    when there is none (a file that does not parse is a miss too: a run never fails on the cache)."""
    path = Path(folder) / f"{key}.json"
    try:
        payload = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return payload if payload.get("key") == key else None


def store(folder: str | Path, key: str, payload: dict) -> Path:
    """Write ``payload`` under ``key`` atomically (a temporary file renamed into place), so
    concurrent jobs that compute the same key never leave a half-written file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{key}.json"
    tmp = folder / f".{key}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({**payload, "key": key}))
    tmp.replace(path)
    return path
