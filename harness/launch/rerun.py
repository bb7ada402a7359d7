"""Re-run a logged run from its MLflow record: ``python -m harness.launch.rerun <run id> [key=value ...]``.

The config is rebuilt from the run's ``config/resolved.yaml`` artifact (the fully resolved
config it trained with), not recomposed from today's ``conf/``: a changed default cannot leak
in. Overrides are ``key=value`` on that config (``seed=1``, ``train.steps=48``); a group choice
(``advantage=rloo``) replaces that node with the option's defaults. The new run is tagged
``rerun_of=<id>``, gets its own checkpoint folder (``checkpoints/rerun-<id8>-<config hash>``,
so the original's checkpoints are untouched and a killed rerun resumes), logs into the same
store (or ``--into`` another), and warns, naming each, about provenance that differs from the
record: package versions, git commit or uncommitted changes, data digests, weight digests
(``rerun.differs.*`` tags). ``--tracking-uri``: the store holding the run (default
``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``).

Exit status 2 with one line for a run id the store does not hold or a bad override.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from harness.launch.config import Config, group_schemas, register_configs
from harness.model.models import ModelLoadError
from harness.launch.run import USER_ERRORS, train
from harness.launch.job import config_key
from harness.launch.schema_docs import group_defaults
from harness.tasks.data import DataError
from harness.launch.tracking import TrackingError, artifact_path, resolve_uri

log = logging.getLogger("harness")


class RerunError(ValueError):
    """The recorded run or an override cannot be used; the message names it."""


def recorded_run(run_id: str, uri: str):
    """``(resolved config dict, params, tags, run name)`` of MLflow run ``run_id`` in ``uri``.

    Raises:
        RerunError: no such run, or it has no ``config/resolved.yaml`` artifact.
    """
    client = MlflowClient(uri)
    try:
        run = client.get_run(run_id)
    except Exception as e:
        raise RerunError(f"run id {run_id!r}: not found in the tracking store {uri!r} ({type(e).__name__})") from e
    try:
        path = artifact_path(client, run, "config/resolved.yaml", uri)
    except Exception as e:
        raise RerunError(f"run {run_id}: no config/resolved.yaml artifact to rebuild the config from") from e
    resolved = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return resolved, dict(run.data.params), dict(run.data.tags), run.info.run_name


def rebuild_config(resolved: dict, overrides: list[str]):
    """The structured :class:`harness.launch.config.Config` of a recorded resolved config plus overrides.

    Raises:
        RerunError: an override without ``=``, an unknown group option or key (naming it).
    """
    register_configs()
    groups = group_schemas()
    resolved = dict(resolved)
    values, choices = [], {}
    for o in overrides:
        if "=" not in o:
            raise RerunError(f"override {o!r}: expected key=value")
        key, value = o.split("=", 1)
        if key in groups:
            if value not in groups[key]:
                raise RerunError(f"override {o!r}: {key} must be one of {sorted(groups[key])}")
            choices[key] = value
            resolved.pop(key, None)
        else:
            values.append(o)
    base = OmegaConf.structured(Config)
    defaults = group_defaults()
    for group, options in groups.items():
        node = resolved.get(group) or {}
        name = choices.get(group) or node.get("name") or node.get("backend")
        if group not in resolved and name is None:
            # recorded before the group existed: the run had what its default keeps (lora=none, reward=verifier)
            name = "none" if "none" in options else defaults.get(group)
        if name not in options:
            raise RerunError(f"recorded {group}: option {name!r} is not one of {sorted(options)} in this checkout")
        base[group] = OmegaConf.structured(options[name])
    try:
        cfg = OmegaConf.merge(base, resolved)
        if values:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(values))
    except Exception as e:
        raise RerunError(f"cannot rebuild the recorded config with {overrides}: {e}") from e
    OmegaConf.set_struct(cfg, True)
    return cfg


def _absolute(uri: str) -> str:
    if uri.startswith("sqlite:///") and not Path(uri[10:]).is_absolute():
        return "sqlite:///" + str(Path.cwd() / uri[10:])
    return uri


def rerun(run_id: str, overrides: list[str] = (), tracking_uri: str | None = None, into: str | None = None) -> float:
    """Train again from run ``run_id``'s record; returns the new run's final eval accuracy.

    Args:
        tracking_uri: the store holding the run (default ``$MLFLOW_TRACKING_URI`` / ``sqlite:///mlflow.db``).
        into: the store the new run goes to (default: the same one).

    Raises:
        RerunError: see :func:`recorded_run` and :func:`rebuild_config`.
    """
    uri = _absolute(resolve_uri(tracking_uri))
    resolved, params, tags, name = recorded_run(run_id, uri)
    cfg = rebuild_config(resolved, list(overrides))
    cfg.tracking.uri = _absolute(into) if into else uri
    cfg.output_dir = None
    cfg.resume = None
    if not any(o.startswith("tracking.run_name=") for o in overrides):
        cfg.tracking.run_name = f"{name}-rerun" if name else None
    if not any(o.startswith("checkpoint.dir=") for o in overrides):
        cfg.checkpoint.dir = str(Path.cwd() / "checkpoints" / f"rerun-{run_id[:8]}-{config_key(cfg)}")
    log.info("rerun of %s (%s) with %s", run_id, name, " ".join(overrides) or "no overrides")
    return train(cfg, rerun_of=run_id, recorded=params)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    ap = argparse.ArgumentParser(prog="python -m harness.launch.rerun", description=__doc__.splitlines()[0])
    ap.add_argument("run_id")
    ap.add_argument("overrides", nargs="*", help="key=value on the recorded config")
    ap.add_argument("--tracking-uri", default=None, help="the store holding the run")
    ap.add_argument("--into", default=None, help="the store the rerun logs to (default: the same)")
    a = ap.parse_args(argv)
    try:
        rerun(a.run_id, a.overrides, a.tracking_uri, a.into)
    except (RerunError, *USER_ERRORS, DataError, ModelLoadError, TrackingError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
