"""Tiny markdown table formatter (avoids a ``tabulate`` dependency for ``DataFrame.to_markdown``)."""

from __future__ import annotations

import math

import pandas as pd


def format_cell(value, floatfmt: str = ".4g") -> str:
    """Render one cell: NaN/None -> empty, floats with ``floatfmt``, pipes escaped."""
    if value is None:
        return ""
    try:
        if pd.isna(value):
            return ""
    except (TypeError, ValueError):
        pass
    if isinstance(value, float) and not math.isinf(value):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        text = format(value, floatfmt)
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(df: pd.DataFrame, floatfmt: str = ".4g", index: bool = False) -> str:
    """Return ``df`` as a GitHub-flavoured markdown table (numeric columns right-aligned)."""
    if index:
        df = df.reset_index()
    if df.shape[1] == 0:
        return "_(empty)_\n"
    headers = [str(c) for c in df.columns]
    rows = [[format_cell(v, floatfmt) for v in row] for row in df.itertuples(index=False, name=None)]
    numeric = [pd.api.types.is_numeric_dtype(df[c]) for c in df.columns]
    widths = [max([len(h)] + [len(r[i]) for r in rows] + [3]) for i, h in enumerate(headers)]

    def line(cells):
        padded = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric)]
        return "| " + " | ".join(padded) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2))
                         for w, num in zip(widths, numeric)) + "|"
    return "\n".join([line(headers), sep, *(line(r) for r in rows)]) + "\n"
