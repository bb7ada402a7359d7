"""Atomic checkpoints (temp file + rename) holding everything needed for an exact resume."""

from __future__ import annotations

import logging
import os
import random
import re
from pathlib import Path

import numpy as np
import torch

log = logging.getLogger(__name__)
_NAME = re.compile(r"^step_(\d+)\.pt$")


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
