"""Sweep files (``sweeps/*.yaml``): their schema, loading and validation.

See :mod:`harness.sweep` for the keys and how a sweep runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
DEFAULT_STORAGE = "sqlite:///optuna.db"
DEFAULT_METRIC = "eval/accuracy"
TOP_KEYS = {"study_name", "storage", "direction", "metric", "n_trials", "sampler", "pruner", "heartbeat",
            "overrides", "params"}
PARAM_KEYS = {"float": {"type", "low", "high", "log", "step"}, "int": {"type", "low", "high", "log", "step"},
              "categorical": {"type", "choices"}}
SAMPLER_KEYS = {"tpe": {"type", "seed", "n_startup_trials", "n_ei_candidates", "multivariate", "group",
                        "constant_liar"},
                "random": {"type", "seed"},
                "grid": {"type", "seed"}}  # every combination of categorical params, each once
PRUNER_KEYS = {"median": {"type", "n_startup_trials", "n_warmup_steps", "interval_steps", "n_min_trials"},
               "none": {"type"}}
HEARTBEAT_KEYS = {"interval", "grace_period", "max_retry"}


class SweepError(ValueError):
    """A bad sweep file or sweep-wide config error; the message names the file and key."""


class TrialFailed(RuntimeError):
    """One trial failed (diverged, out of memory, ...); the sweep goes on with the next one."""


# --------------------------------------------------------------------------- sweep file


@dataclass
class Param:
    """One search dimension; ``name`` is a Hydra override key (``train.lr``, ``advantage``)."""

    name: str
    type: str
    low: Any = None
    high: Any = None
    log: bool = False
    step: Any = None
    choices: list = field(default_factory=list)

    def suggest(self, trial):
        if self.type == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log, step=self.step)
        if self.type == "int":
            return trial.suggest_int(self.name, self.low, self.high, log=self.log, step=self.step or 1)
        return trial.suggest_categorical(self.name, self.choices)

    def probe_values(self) -> list:
        """Values composed before the sweep starts (catches unknown keys / group options early)."""
        return list(self.choices) if self.type == "categorical" else [self.low, self.high]


@dataclass
class Sweep:
    path: str
    study_name: str
    n_trials: int
    params: list
    storage: str = DEFAULT_STORAGE
    direction: str = "maximize"
    metric: str = DEFAULT_METRIC
    sampler: dict = field(default_factory=lambda: {"type": "tpe", "seed": 0})
    pruner: dict = field(default_factory=lambda: {"type": "none"})
    heartbeat: dict = field(default_factory=dict)
    overrides: list = field(default_factory=list)

    def err(self, key: str, msg: str) -> SweepError:
        return SweepError(f"{self.path}: {key}: {msg}")


def _check_keys(path: str, where: str, d: dict, allowed: set) -> None:
    unknown = sorted(set(d) - allowed)
    if unknown:
        raise SweepError(f"{path}: {where}{unknown[0]}: unknown key (expected one of {sorted(allowed)})")


def _number(path: str, key: str, v, kind: type) -> Any:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) if kind is float else (
        isinstance(v, int) and not isinstance(v, bool))
    if not ok:
        raise SweepError(f"{path}: {key}: expected {'a number' if kind is float else 'an integer'}, got {v!r}")
    return kind(v)


def _section(path: str, key: str, raw, allowed_by_type: dict, default_type: str | None) -> dict:
    if raw is None or isinstance(raw, str):  # `pruner: none`, `sampler: tpe`
        raw = {"type": raw or "none"}
    if not isinstance(raw, dict):
        raise SweepError(f"{path}: {key}: expected a mapping with a 'type', got {raw!r}")
    raw = dict(raw)
    kind = str(raw.get("type", default_type))
    if kind not in allowed_by_type:
        raise SweepError(f"{path}: {key}.type: unknown {key} {kind!r} (expected one of {sorted(allowed_by_type)})")
    raw["type"] = kind
    _check_keys(path, f"{key}.", raw, allowed_by_type[kind])
    return raw


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file.

    Raises:
        SweepError: one line naming the file and the offending key.
    """
    p = str(path)
    raw = _read(p)
    _check_keys(p, "", raw, TOP_KEYS)
    for key in ("study_name", "n_trials", "params"):
        if raw.get(key) is None:
            raise SweepError(f"{p}: {key}: missing required key")
    if not isinstance(raw["study_name"], str) or not re.fullmatch(r"[\w.\-]+", raw["study_name"]):
        raise SweepError(f"{p}: study_name: expected letters, digits, '_', '-' or '.', got {raw['study_name']!r}")
    n_trials = _number(p, "n_trials", raw["n_trials"], int)
    direction = raw.get("direction", "maximize")
    if direction not in ("maximize", "minimize"):
        raise SweepError(f"{p}: direction: expected maximize or minimize, got {direction!r}")
    overrides = raw.get("overrides") or []
    if not isinstance(overrides, list) or not all(isinstance(o, str) and "=" in o for o in overrides):
        raise SweepError(f"{p}: overrides: expected a list of Hydra 'key=value' strings, got {overrides!r}")
    if not isinstance(raw["params"], dict) or not raw["params"]:
        raise SweepError(f"{p}: params: expected a non-empty mapping of override key -> search space")
    params = [_param(p, str(name), spec) for name, spec in raw["params"].items()]
    hb = _heartbeat(p, raw.get("heartbeat") or {})
    metric = raw.get("metric", DEFAULT_METRIC)
    if not isinstance(metric, str) or not metric:
        raise SweepError(f"{p}: metric: expected a metric name like eval/accuracy, got {metric!r}")
    sampler = _section(p, "sampler", raw.get("sampler", {"type": "tpe"}), SAMPLER_KEYS, "tpe")
    if sampler["type"] == "grid":
        for prm in params:
            if prm.type != "categorical":
                raise SweepError(f"{p}: params.{prm.name}.type: the grid sampler needs categorical params")
    return Sweep(
        path=p, study_name=raw["study_name"], n_trials=n_trials, params=params,
        storage=str(raw.get("storage") or DEFAULT_STORAGE), direction=direction, metric=metric,
        sampler=sampler,
        pruner=_section(p, "pruner", raw.get("pruner", "none"), PRUNER_KEYS, "median"),
        heartbeat=hb, overrides=list(overrides),
    )


def _read(p: str) -> dict:
    """The sweep file ``p`` as a mapping."""
    try:
        raw = yaml.safe_load(Path(p).read_text())
    except FileNotFoundError:
        raise SweepError(f"{p}: no such sweep file") from None
    except yaml.YAMLError as e:
        raise SweepError(f"{p}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(raw, dict):
        raise SweepError(f"{p}: expected a mapping of sweep keys (study_name, n_trials, params, ...)")
    return raw


def _param(p: str, name: str, spec) -> Param:
    """``params.<name>``: a categorical, float or int search space."""
    key = f"params.{name}"
    if not isinstance(spec, dict):
        raise SweepError(f"{p}: {key}: expected a mapping like {{type: float, low: .., high: ..}}")
    kind = spec.get("type")
    if kind is None:
        raise SweepError(f"{p}: {key}.type: missing required key (float, int or categorical)")
    if kind not in PARAM_KEYS:
        raise SweepError(f"{p}: {key}.type: unknown type {kind!r} (expected float, int or categorical)")
    _check_keys(p, f"{key}.", spec, PARAM_KEYS[kind])
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SweepError(f"{p}: {key}.choices: expected a non-empty list")
        if not all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
            raise SweepError(f"{p}: {key}.choices: only null, bool, int, float and str values are allowed")
        return Param(name, kind, choices=choices)
    num = float if kind == "float" else int
    for bound in ("low", "high"):
        if bound not in spec:
            raise SweepError(f"{p}: {key}.{bound}: missing required key for type {kind}")
    low, high = _number(p, f"{key}.low", spec["low"], num), _number(p, f"{key}.high", spec["high"], num)
    if low > high:
        raise SweepError(f"{p}: {key}.low: {low} is above high={high}")
    log_ = bool(spec.get("log", False))
    if log_ and low <= 0:
        raise SweepError(f"{p}: {key}.low: log scale needs low > 0, got {low}")
    step = _number(p, f"{key}.step", spec["step"], num) if spec.get("step") is not None else None
    if step is not None and log_:
        raise SweepError(f"{p}: {key}.step: cannot be combined with log: true")
    return Param(name, kind, low=low, high=high, log=log_, step=step)


def _heartbeat(p: str, hb) -> dict:
    """``heartbeat``: positive integers (``max_retry`` may be null)."""
    if not isinstance(hb, dict):
        raise SweepError(f"{p}: heartbeat: expected a mapping {{interval, grace_period, max_retry}}")
    _check_keys(p, "heartbeat.", hb, HEARTBEAT_KEYS)
    for k, v in hb.items():
        if not (v is None and k == "max_retry") and _number(p, f"heartbeat.{k}", v, int) < (0 if k == "max_retry" else 1):
            raise SweepError(f"{p}: heartbeat.{k}: expected a positive integer, got {v!r}")
    return hb


# ------------------------------------------------------------------------- overrides
