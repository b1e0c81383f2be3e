"""Small helpers to put measured numbers into the rendered page (markdown tables)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["markdown_table", "show_table", "pct"]


def pct(x: float | None, digits: int = 2) -> str:
    """``0.99612 -> "99.61 %"``; ``None -> "—"``."""
    return "—" if x is None else f"{100 * x:.{digits}f} %"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table (cells converted with ``str``; ``|`` escaped)."""

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def show_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]):
    """Display a markdown table in a notebook (returns the ``IPython.display.Markdown`` object)."""
    from IPython.display import Markdown

    return Markdown(markdown_table(headers, rows))
