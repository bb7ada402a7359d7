"""Atomic checkpoints (temp file + rename) holding everything needed for an exact resume, and what
a finished run keeps (``checkpoint.keep_final``): the finished marker, and the final weights."""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step_(\d+)\.pt$")

KEEP_FINAL = ("weights", "merged", "full", "none")
"""``checkpoint.keep_final``: what a finished run's folder keeps besides its finished marker."""
KEEP_FOLDER = ("weights", "merged")
"""The ``keep_final`` values that write the final policy as a folder (:data:`FINAL_WEIGHTS`)."""
FINAL_WEIGHTS = "final"
"""The folder (``<checkpoint dir>/final/``) of a finished run's policy: a Hugging Face model folder
(``model.safetensors``, ``config.json``, the tokenizer) that ``model.name_or_path`` loads; for
``lora=peft`` with ``keep_final=weights`` peft's adapter folder (``adapter_config.json``,
``adapter_model.safetensors``, the tokenizer: :meth:`harness.model.lora.PeftLora.save_final`)."""
MODEL_STATES = ("policy", "optimizer", "ref", "critic", "lagged")
"""The entries of a checkpoint that hold model or optimizer state (a finished marker drops them);
``lagged``: a stale run's behaviour weights and pending versions (:mod:`harness.train.staleness`)."""


def rng_state() -> dict:
    """Python, numpy and torch RNG states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save(folder: str | Path, step: int, state: dict, keep: int = 2) -> Path:
    """Write ``state`` to ``folder/step_<step>.pt`` atomically and keep the last ``keep`` files.

    ``state`` holds module/optimizer state dicts, RNG states, the step counter, the data
    position and the MLflow run id (see ``Trainer.state_dict``). Returns the file path.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:06d}.pt"
    tmp = folder / f".step_{step:06d}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)
    for old in list_checkpoints(folder)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    log.info("checkpoint saved: %s", path)
    return path


def save_final_weights(folder: str | Path, write, tokenizer=None) -> Path:
    """Write the final policy as ``folder/final/`` atomically: ``write(tmp)`` fills a temporary
    folder (the weights: :meth:`harness.model.lora.FullFineTuning.save_final`), the tokenizer is added,
    and the folder is renamed over any previous one. Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dest, tmp = folder / FINAL_WEIGHTS, folder / f".{FINAL_WEIGHTS}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    write(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def finished_marker(state: dict, keep_final: str) -> dict:
    """The finished run's checkpoint as ``checkpoint.keep_final`` keeps it: whole for ``full``; for
    ``weights``, ``merged`` and ``none`` without :data:`MODEL_STATES` (the step, the MLflow run id, the config
    key and the unsent metrics stay: what an idempotent rerun reads)."""
    if keep_final == "full":
        return {**state, "keep_final": keep_final}
    return {**{k: v for k, v in state.items() if k not in MODEL_STATES}, "keep_final": keep_final,
            "weights": FINAL_WEIGHTS if keep_final in KEEP_FOLDER else None}


def has_model_states(state: dict) -> bool:
    """Whether a checkpoint can be resumed from (a ``keep_final=weights|merged|none`` marker cannot)."""
    return state.get("policy") is not None and state.get("optimizer") is not None


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Checkpoint files in ``folder`` sorted by step (oldest first)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    files = [p for p in folder.iterdir() if _NAME.match(p.name)]
    return sorted(files, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest(folder: str | Path) -> Path | None:
    files = list_checkpoints(folder)
    return files[-1] if files else None


def load(path: str | Path) -> dict:
    """Load a checkpoint file (or the latest in a folder).

    Raises:
        FileNotFoundError: naming the path when nothing is there.
    """
    path = Path(path)
    if path.is_dir():
        found = latest(path)
        if found is None:
            raise FileNotFoundError(f"resume={str(path)!r}: no step_*.pt checkpoint in that folder")
        path = found
    if not path.is_file():
        raise FileNotFoundError(f"resume={str(path)!r}: no such checkpoint file or folder")
    return torch.load(path, map_location="cpu", weights_only=False)
