"""The docs cannot drift from the code: the configuration reference is the rendering of the schemas,
and the knob prose names no default that the schema does not have."""

from __future__ import annotations

import dataclasses
import re

import mkdocs_hooks
from harness.launch import schema_docs
from harness.launch.config import group_schemas


def test_the_docs_build_writes_the_reference_from_the_schemas(tmp_path, monkeypatch):
    """mkdocs.yml runs mkdocs_hooks.py, whose pre-build hook writes the rendering of the schemas
    (the page is generated, not committed: it cannot drift)."""
    assert "mkdocs_hooks.py" in (schema_docs.ROOT / "mkdocs.yml").read_text().split("hooks:")[1].split("plugins:")[0]
    page = tmp_path / "reference" / "config.md"
    monkeypatch.setattr(schema_docs, "PAGE", page)
    mkdocs_hooks.on_pre_build(config=None)
    assert page.read_text() == schema_docs.render()


def test_reference_lists_every_group_option_and_field():
    page = schema_docs.render()
    for group, options in group_schemas().items():
        for option, dc in options.items():
            assert f"### `{group}={option}`" in page
            for f in dataclasses.fields(dc):
                if f.name != "name":
                    assert f"`{group}.{f.name}`" in page, (group, option, f.name)


def test_knob_tables_state_the_schema_defaults():
    """docs/knobs.md's variant tables write parameters as ``name`` (default): each such default
    must be the params dataclass's default, so a changed default fails here until the prose
    follows (or drops the number)."""
    text = (schema_docs.ROOT / "docs" / "knobs.md").read_text()
    checked = 0
    for group, options in group_schemas().items():
        for option, dc in options.items():
            row = re.search(rf"^\| `{re.escape(option)}` \|.*$", text, re.M)
            if not row:
                continue
            for f in dataclasses.fields(dc):
                m = re.search(rf"`{f.name}` \(([^)]*)\)", row.group(0))
                if not m or f.default is dataclasses.MISSING:
                    continue
                stated = m.group(1).split(":")[0].split()[0].rstrip(",")
                want = {None: "null", True: "true", False: "false"}.get(f.default, f.default) \
                    if not isinstance(f.default, (int, float)) or isinstance(f.default, bool) else f.default
                if isinstance(want, (int, float)):
                    assert float(stated) == float(want), (group, option, f.name, stated, want)
                else:
                    assert stated == str(want), (group, option, f.name, stated, want)
                checked += 1
    assert checked > 20, f"only {checked} defaults found in docs/knobs.md: the table format changed?"


def test_readme_stays_under_150_lines():
    """The README is the newcomer's first page: what the harness is, the two commands, the test
    tiers, the studies table and the map of the docs. Everything else belongs on a docs page
    (issue 47), so the README fails here above 150 lines."""
    lines = (schema_docs.ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines (at most 150): move detail to docs/"
    assert "<!-- studies-table: copied from results/STUDIES.md -->" in lines
    assert "<!-- /studies-table -->" in lines
