"""Secrets never reach a record: redaction of credentials in everything logged or printed.

A shared Optuna study or MLflow store is only safe behind a password, and a run records its
whole resolved config (MLflow params, ``config/resolved.yaml``), its command line (the run's
note), Hydra's ``.hydra/*.yaml`` files and its log. A password inside a URL
(``postgresql://user:secret@host/db``) would land in all of them in clear. So:

* :func:`redact` replaces the password of every ``scheme://user:password@host`` URL with
  ``***`` and every known secret value (the environment variables in :data:`SECRET_ENV`, and
  the passwords of URLs seen so far) wherever it appears;
* :func:`install` makes every log record pass through :func:`redact` (a log-record factory, so
  it holds for Hydra's launcher lines and every library's logger alike);
* the run, the sweep driver and :mod:`harness.launch.tracking` pass params, tags, artifacts, study
  attributes and printed lines through it.

Credentials belong in the environment or a file, not on the command line (which shell history
keeps). Each engine reads its own: PostgreSQL clients (psycopg/libpq) ``PGPASSWORD`` or
``~/.pgpass`` (``PGPASSFILE``); the MLflow client ``MLFLOW_TRACKING_USERNAME`` /
``MLFLOW_TRACKING_PASSWORD`` or ``~/.mlflow/credentials``. :func:`warn_inline` warns when a
URL carries its password anyway.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from urllib.parse import unquote

MASK = "***"

#: Environment variables whose values are secrets (their values are masked wherever they appear).
SECRET_ENV = ("PGPASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_AUTH_ADMIN_PASSWORD",
              "MLFLOW_FLASK_SERVER_SECRET_KEY", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "WANDB_API_KEY")

# scheme://user:password@ ; also as Hydra prints overrides, with escaped colons (scheme\://user\:pw@)
_URL_AUTH = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.\-]*\\?://[^\s/:@'\"\\]*\\?:)(?P<pw>[^\s/@'\"\\]+)(?=@)")
_seen: set[str] = set()


def url_password(url: str) -> str | None:
    """The password inside ``url`` (``scheme://user:password@host...``), or None."""
    m = _URL_AUTH.search(url or "")
    return unquote(m.group("pw")) if m and m.group("pw") != MASK else None


def remember(secret: str | None) -> None:
    """Mask ``secret`` from now on wherever it appears (values under 4 characters are ignored:
    masking them would garble ordinary text)."""
    if secret and len(secret) >= 4 and secret != MASK:
        _seen.add(secret)


def _known() -> list[str]:
    vals = {os.environ.get(k) for k in SECRET_ENV} | _seen
    return sorted((v for v in vals if v and len(v) >= 4), key=len, reverse=True)


def redact(text):
    """``text`` with URL passwords and known secret values replaced by ``***``.

    Args:
        text: a string; other types are returned unchanged (see :func:`redact_obj` for containers).
    """
    if not isinstance(text, str):
        return text
    for m in _URL_AUTH.finditer(text):
        remember(m.group("pw"))
        remember(unquote(m.group("pw")))
    out = _URL_AUTH.sub(lambda m: m.group("head") + MASK, text)
    for secret in _known():
        if secret in out:
            out = out.replace(secret, MASK)
    return out


def redact_obj(obj):
    """:func:`redact` applied to every string in nested dicts / lists / tuples (keys included)."""
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {redact_obj(k): redact_obj(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(redact_obj(v) for v in obj)
    return obj


def warn_inline(name: str, url: str | None) -> None:
    """Warn (once per name) when ``url`` carries a password: it is masked in the records, but the
    command line that set it is in shell history; point to the engine's own environment
    variable or file instead. Remembers the password for :func:`redact`."""
    pw = url_password(url or "")
    if pw is None:
        return
    remember(pw)
    hint = ("PGPASSWORD or ~/.pgpass (PGPASSFILE)" if (url or "").startswith("postgres")
            else "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or ~/.mlflow/credentials"
            if (url or "").startswith("http") else "the engine's credentials environment variable or file")
    warnings.warn(f"{name} carries a password in its URL ({redact(url)}); it is masked in every record, but "
                  f"leave it out of the URL and use {hint}", stacklevel=2)


_installed = False


def install() -> None:
    """Redact every log record from now on (idempotent): a log-record factory that formats the
    message, masks it with :func:`redact` and clears the arguments (exception text included)."""
    global _installed
    if _installed:
        return
    _installed = True
    base = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = base(*args, **kwargs)
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record: leave it to logging to report
            return record
        clean = redact(msg)
        if clean != msg or record.args:
            record.msg, record.args = clean, ()
        return record

    logging.setLogRecordFactory(factory)


def scrub_file(path) -> bool:
    """Rewrite text file ``path`` with :func:`redact` applied; True if anything was masked."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError):
        return False
    clean = redact(text)
    if clean != text:
        p.write_text(clean)
        return True
    return False
