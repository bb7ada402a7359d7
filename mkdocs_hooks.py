"""mkdocs hooks (``hooks:`` in mkdocs.yml): the configuration reference is written from the
registered schemas at every build, so the page cannot drift from the code and a new task,
variant or key needs no edit of it (``docs/reference/config.md`` is generated, git-ignored)."""

from __future__ import annotations

from harness.launch import schema_docs


def on_pre_build(config, **kwargs) -> None:
    """Write ``docs/reference/config.md`` (:func:`harness.launch.schema_docs.render`) before mkdocs
    collects the pages."""
    schema_docs.PAGE.parent.mkdir(parents=True, exist_ok=True)
    schema_docs.PAGE.write_text(schema_docs.render())
