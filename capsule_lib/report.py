"""Small helpers to put measured numbers into the rendered page (markdown tables)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["markdown_table", "show_table", "pct", "duration", "budget_rows", "show_budgets", "BUDGET_HEADERS"]


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


def duration(seconds: float) -> str:
    """``324 -> "5.4 min"``, ``15840 -> "4.4 h"`` (a non-breaking space before the unit: table cells do not wrap
    inside it)."""
    return f"{seconds / 60:.1f}\u00a0min" if seconds < 7200 else f"{seconds / 3600:.1f}\u00a0h"


#: the columns of :func:`budget_rows`
BUDGET_HEADERS = ("checkpoint", "hardware", "epochs (best)", "time", "val.", "test")  # short: six fit the page


def budget_rows(names: Sequence[str]) -> list[list[str]]:
    """What each shipped checkpoint's training budget bought, one row per name, read from the registry: the
    hardware, the epochs run (fractional when a time budget stopped the run inside an epoch) and, in brackets, the
    one selected on validation, the training wall time, and the validation and test accuracy of the shipped weights
    (columns ``BUDGET_HEADERS``)."""
    from .pretrained import registry

    reg, rows = registry(), []
    for name in names:
        e = reg[name]
        t, m = e["training"], e["metrics"]
        epochs = f"{t['epochs']:.2f}".rstrip("0").rstrip(".")
        rows.append(
            [
                f"`{name}`",
                t["hardware"],
                f"{epochs} ({m['selected_epoch']})",
                duration(t["wall_time_s"]),
                pct(m.get("val_acc")).replace(" ", "\u00a0"),
                pct(m.get("test_acc")).replace(" ", "\u00a0"),
            ]
        )
    return rows


def show_budgets(names: Sequence[str]):
    """:func:`budget_rows` as a table in a notebook."""
    return show_table(BUDGET_HEADERS, budget_rows(names))
