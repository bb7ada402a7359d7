"""Tools registered by name (:data:`TOOLS`); ``tools=<name>`` in the config picks one.

Every module of this package is imported here, so a module that registers a tool (see
:mod:`harness.tools.base`) is all it takes to add one.
"""

from __future__ import annotations

from typing import Optional

from harness.registry import import_package_modules
from harness.tools.base import TOOLS, Observation, ToolConfig, ToolError, ToolRunner

import_package_modules(__name__)


def build_tool(params) -> Optional[ToolRunner]:
    """The runner of the tool named by ``params.name`` (the ``tools`` node), or None for ``none``.

    Raises:
        ValueError: unknown name (lists the valid ones), a key the tool's params lack, or the
            tool's own refusal of its params.
    """
    name = params.name if params is not None else "none"
    if name == "none":
        return None
    spec = TOOLS.spec(name)
    built = spec.build(params)
    return ToolRunner(spec.fn(built), built)


__all__ = ["TOOLS", "Observation", "ToolConfig", "ToolError", "ToolRunner", "build_tool"]
