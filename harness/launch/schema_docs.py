"""The configuration reference, rendered from the registered schemas (``docs/reference/config.md``).

    python -m harness.launch.schema_docs            # print the reference
    python -m harness.launch.schema_docs --write    # write docs/reference/config.md (mkdocs build does it too)

Every key, its type, its default and the comment beside its declaration come from the
dataclasses themselves (``harness.launch.config`` and the params dataclasses of the registries, which
are the Hydra schemas), and the default option of each config group from ``conf/config.yaml``.
Nothing is kept by hand, and nothing is committed: ``mkdocs build`` (``make docs``) writes the page
at every build (``mkdocs_hooks.py``), so it cannot drift from the code, and adding a task, a
variant or a key needs no edit of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from pathlib import Path

import yaml
from omegaconf import MISSING

from harness.launch.config import Config, group_schemas

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "config.md"
_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+?(?:=\s*(?P<rhs>.*?))?\s*(?:#\s*(?P<comment>.*))?$")


def _comments(dc: type) -> dict[str, str]:
    """``{field: comment}`` from the ``# ...`` beside (or on the line above) each field's declaration."""
    try:
        lines = inspect.getsource(dc).splitlines()
    except (OSError, TypeError):
        return {}
    out, above = {}, []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        m = _FIELD.match(line)
        if m and m.group(1) in {f.name for f in dataclasses.fields(dc)}:
            text = m.group("comment") or " ".join(above)
            out[m.group(1)] = text.strip()
        above = []
    return out


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if value is MISSING:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(node)"
    return f"`{yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix('...').strip()}`"


def _type(t) -> str:
    args = typing.get_args(t)
    if typing.get_origin(t) is typing.Union:
        return " or ".join(_type(a) for a in args)
    name = getattr(t, "__name__", None) or str(t).replace("typing.", "")
    return name.replace("NoneType", "None")


def _table(dc: type, prefix: str, skip=()) -> list[str]:
    hints = typing.get_type_hints(dc)
    notes = _comments(dc)
    rows = ["| key | type | default | note |", "|---|---|---|---|"]
    for f in dataclasses.fields(dc):
        if f.name in skip or dataclasses.is_dataclass(hints[f.name]):
            continue
        note = notes.get(f.name, "").replace("|", "\\|")
        rows.append(f"| `{prefix}{f.name}` | {_type(hints[f.name])} | {_default(f)} | {note} |")
    return rows


def _doc(dc: type) -> str:
    doc = inspect.getdoc(dc) or ""
    return "" if doc.startswith(f"{dc.__name__}(") else " ".join(doc.split("\n\n")[0].split())


def group_defaults() -> dict[str, str]:
    """``{group: default option}`` from the defaults list of ``conf/config.yaml``."""
    raw = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    out = {}
    for item in raw.get("defaults", []):
        if isinstance(item, dict):
            for k, v in item.items():
                out[k.split("@")[0].removeprefix("override ").strip()] = v
    return out


def render() -> str:
    """The reference page as markdown (deterministic: same code, same page)."""
    groups = group_schemas()
    chosen = group_defaults()
    out = ["# Configuration reference", "",
           "Generated at every `mkdocs build` (`make docs`; or `python -m harness.launch.schema_docs`) from the schemas",
           "in `harness/launch/config.py` and the params dataclasses of the registries, so it cannot differ from the",
           "code. Formulas, sources and conventions: [Knobs](../knobs.md).", ""]
    hints = typing.get_type_hints(Config)
    out += ["## Run (`Config`)", "", *_table(Config, "", skip={*groups, "model"}), ""]
    nodes = [(f.name, hints[f.name]) for f in dataclasses.fields(Config)
             if f.name not in groups and dataclasses.is_dataclass(hints[f.name])]
    for name, dc in nodes:
        out += [f"## `{name}` ({dc.__name__})", ""]
        if _doc(dc):
            out += [_doc(dc), ""]
        out += [*_table(dc, f"{name}."), ""]
    for group, options in groups.items():
        out += [f"## Group `{group}`", "",
                f"Options: {', '.join(f'`{o}`' for o in options)}. Default: `{chosen.get(group, '(none)')}`.", ""]
        for option, dc in options.items():
            fields = [f for f in dataclasses.fields(dc) if f.name != "name"]
            out += [f"### `{group}={option}`", ""]
            if _doc(dc):
                out += [_doc(dc), ""]
            out += [*(_table(dc, f"{group}.", skip={"name"}) if fields else ["No parameters."]), ""]
    return "\n".join(out).rstrip() + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.launch.schema_docs", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    text = render()
    if args.write:
        PAGE.parent.mkdir(parents=True, exist_ok=True)
        PAGE.write_text(text)
        print(f"wrote {PAGE.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
