"""Loading JSON Lines files (through ``datasets``) with errors that name file and line."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def hf_datasets():
    """The ``datasets`` module, imported on first use: only the gsm8k / math loaders need it, and it
    pulls ``pyarrow`` (a 55 MB wheel for CPython 3.12), which the GPU machine's bundle
    (``make gpu-bundle``) cannot carry; ``task=arith`` runs without it.

    Raises:
        DataError: ``datasets`` is not installed (naming the package to install).
    """
    try:
        import datasets  # lazy: pyarrow (55 MB) is too large for the GPU bundle; see the docstring
    except ModuleNotFoundError as e:
        raise DataError("loading a task's data files needs the `datasets` package (pip install datasets); "
                        "task=arith needs no data") from e
    return datasets


class DataError(ValueError):
    """Bad or missing data; the message names the file (and line) and how to fix it."""


def resolve_data_dir(configured: str | None, env_var: str) -> Path | None:
    """The local data folder: the config value, else ``$env_var``, else None (use the hub)."""
    value = configured or os.environ.get(env_var)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise DataError(
            f"data folder {str(path)!r} does not exist (from task.data_dir or ${env_var}); "
            f"point task.data_dir=... or {env_var}=... at a folder holding the JSONL files"
        )
    return path


def _find_bad_line(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                return f"{path}:{lineno}: malformed JSON ({e.msg})"
            if not isinstance(obj, dict):
                return f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
    return f"{path}: could not be read as JSON Lines"


def load_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file via ``datasets.load_dataset("json")``.

    Raises:
        DataError: the file is missing (naming the path) or a line is malformed (file:line).
    """
    if not path.is_file():
        raise DataError(f"data file {str(path)!r} not found; expected JSON Lines at that path")
    load = hf_datasets().load_dataset  # outside the try: a missing package is not a malformed line
    try:
        ds = load("json", data_files=str(path), split="train")
    except Exception as e:  # datasets wraps parse errors in several types
        raise DataError(_find_bad_line(path)) from e
    return ds.to_list()


def require_fields(rows: list[dict], fields: tuple[str, ...], source: str, strict: bool):
    """Keep rows that have every field non-empty; count or raise for the others.

    Returns:
        (kept_rows, kept_line_numbers, skipped_count); line numbers are 1-based.
    Raises:
        DataError: with ``strict``, naming ``source:line`` and the missing field.
    """
    kept, lines, skipped = [], [], 0
    for i, row in enumerate(rows, 1):
        missing = [f for f in fields if row.get(f) in (None, "")]
        if missing:
            if strict:
                raise DataError(f"{source}:{i}: missing or empty field(s) {missing}")
            skipped += 1
            continue
        kept.append(row)
        lines.append(i)
    if skipped:
        log.warning("%s: skipped %d row(s) with missing or empty fields %s", source, skipped, fields)
    return kept, lines, skipped
