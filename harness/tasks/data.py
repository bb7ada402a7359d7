"""Loading JSON Lines files (through ``datasets``) with errors that name file and line."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

from huggingface_hub import HfApi

log = logging.getLogger(__name__)

HUB_TIMEOUT_S = 10.0
"""How long :func:`from_hub` waits for the hub's answer about one dataset, in seconds."""


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


@contextlib.contextmanager
def from_hub(task: str, repo_ids: tuple[str, ...], env_var: str, files: str):
    """Load ``task``'s data from the Hugging Face hub inside this block, or stop with one clear error.

    Before the block, each of ``repo_ids`` is asked for once (``HfApi.dataset_info``, waiting at most
    :data:`HUB_TIMEOUT_S`): ``datasets`` retries an unreachable hub five times (about 25 s) before it
    raises ``ConnectionError``, where one request answers at once. In offline mode (``HF_HUB_OFFLINE=1``)
    nothing is asked and ``datasets`` reads its cache. A hub that cannot serve the data, either way,
    becomes a :class:`DataError` naming both fixes: a local folder holding ``files`` (``task.data_dir``
    or ``$env_var``) and the hub dataset ids.

    Raises:
        DataError: the hub is unreachable, refuses a dataset id, or is offline without a cached copy.
    """
    offline = hf_datasets().config.HF_HUB_OFFLINE
    ids = " and ".join(repr(r) for r in repo_ids)
    how = ("unset HF_HUB_OFFLINE, with network access or HF_ENDPOINT naming a mirror" if offline else
           "network access, or HF_ENDPOINT naming a mirror; a copy already in the Hugging Face cache loads with "
           "HF_HUB_OFFLINE=1")

    def error(reason: str) -> DataError:
        return DataError(
            f"no data for task={task}: no local folder is set (task.data_dir, ${env_var}) and the Hugging Face "
            f"hub cannot serve {ids} ({reason}). Either point {env_var}=<folder> or task.data_dir=<folder> at "
            f"a folder holding {files}, or make the hub dataset{'s' if len(repo_ids) > 1 else ''} {ids} "
            f"reachable ({how})")

    if not offline:
        for repo_id in repo_ids:
            try:
                HfApi().dataset_info(repo_id, timeout=HUB_TIMEOUT_S)
            except Exception as e:  # no connection, a timeout, an HTTP status, authentication: one message
                raise error(f"{type(e).__name__}: {_first_line(e)}") from e
    try:
        yield
    except ConnectionError as e:  # datasets' "Couldn't reach ... on the Hub"; OfflineModeIsEnabled
        raise error(("offline mode (HF_HUB_OFFLINE=1), no copy in the cache: " if offline else "") + _first_line(e)) from e


def _first_line(e: BaseException) -> str:
    return next(iter(str(e).strip().splitlines()), "")


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
