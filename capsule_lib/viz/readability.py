"""Can a reader read a figure at the size the book shows it? :func:`check_figure_readable` measures every text
of a matplotlib figure at display size and counts the panels of each row.

The book shows a figure as the inline backend saves it (``savefig(dpi=fig.dpi, bbox_inches="tight")``, a PNG
of the tight bounding box) and the browser scales it down to the content column when it is wider
(``max-width: 100%``): displayed at ``min(natural width, column)`` px. A text of ``s`` points is then
``s / 72 * dpi * scale`` px high, ``scale = min(1, column_px / natural_px)``. Page-mode explorer frames
(:func:`capsule_lib.viz.page.figure_png`) are saved at their own ``dpi`` and shown the same way: pass it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Text

from .plots import COLUMN_PX

__all__ = ["check_figure_readable", "displayed_width", "MIN_TEXT_PX", "MAX_PANELS_PER_ROW"]

#: the smallest text height (px, at display size) a reader can read comfortably
MIN_TEXT_PX = 8.0
#: the most panels side by side in one row (with more, each gets too narrow in the column); strips of pictures
#: excepted
MAX_PANELS_PER_ROW = 3


@contextmanager
def _recording_texts() -> Iterator[dict[int, Text]]:
    """Record every :class:`~matplotlib.text.Text` that is drawn (visible, non-empty, inside a drawn artist:
    a tick label of an axis turned off or a tick outside the view is never drawn, so never recorded)."""
    drawn: dict[int, Text] = {}
    original = Text.draw

    def draw(self: Text, renderer: object) -> None:
        if self.get_visible() and self.get_text().strip():
            drawn[id(self)] = self
        original(self, renderer)

    Text.draw = draw  # type: ignore[method-assign]
    try:
        yield drawn
    finally:
        Text.draw = original  # type: ignore[method-assign]


def _saved(fig: Figure, dpi: float) -> tuple[int, list[Text]]:
    """The width (px) of ``fig`` saved as the inline backend saves it (``bbox_inches="tight"`` at ``dpi``: the
    tight bounding box plus ``savefig.pad_inches`` on each side) and the texts drawn in it. The figure is drawn
    once without rendering pixels (its layout engine runs as in a save)."""
    with _recording_texts() as drawn:
        fig.draw_without_rendering()
    bbox = fig.get_tightbbox(fig._get_renderer())  # the renderer of that draw (cached by the canvas)
    pad = plt.rcParams["savefig.pad_inches"]
    return round((bbox.width + 2 * pad) * dpi), list(drawn.values())


def displayed_width(fig: Figure, dpi: float | None = None, column_px: float = COLUMN_PX) -> float:
    """The width (px) at which the book shows ``fig`` saved at ``dpi`` (default ``fig.dpi``): its tight PNG
    width, or ``column_px`` if that is narrower."""
    width, _ = _saved(fig, dpi or fig.dpi)
    return min(width, column_px)


def _kinds(fig: Figure) -> dict[int, str]:
    """What each text of ``fig`` is, for the messages (by ``id``): title, axis label, tick label, legend..."""
    kinds: dict[int, str] = {}
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                kinds[id(tick.label1)] = kinds[id(tick.label2)] = "tick label"
            kinds[id(axis.label)] = "colour-bar label" if _is_colorbar(ax) else "axis label"
            kinds[id(axis.offsetText)] = "axis offset"
        for title in (ax.title, getattr(ax, "_left_title", None), getattr(ax, "_right_title", None)):
            kinds[id(title)] = "title"
    for legend in [ax.get_legend() for ax in fig.axes] + list(fig.legends):
        if legend is not None:
            kinds.update({id(t): "legend" for t in [*legend.get_texts(), legend.get_title()]})
    if getattr(fig, "_suptitle", None) is not None:
        kinds[id(fig._suptitle)] = "suptitle"
    return kinds


def _is_colorbar(ax: Axes) -> bool:
    return hasattr(ax, "_colorbar") or ax.get_label() == "<colorbar>"


def _has_ticklabels(ax: Axes, drawn: set[int]) -> bool:
    """Whether ``ax`` draws tick labels: a chart (a plot, a bar chart, a heat map with named rows), not a picture."""
    return any(id(t) in drawn for t in ax.get_xticklabels() + ax.get_yticklabels())


def _shows_something(ax: Axes) -> bool:
    return ax.get_visible() and bool(ax.images or ax.lines or ax.patches or ax.collections or ax.texts or ax.axison)


def _rows(fig: Figure) -> list[list[Axes]]:
    """The main axes (no colour bars, insets, twins or empty cells) grouped by vertical position: the axes whose
    height spans the vertical centre of another are in its row; one list per distinct row, widest first."""
    main, seen = [], set()
    for ax in fig.axes:
        if _is_colorbar(ax) or ax.get_axes_locator() is not None or not _shows_something(ax):
            continue
        box = tuple(round(v, 3) for v in ax.get_position().bounds)
        if box in seen:  # a twinx/twiny axes sits on its host
            continue
        seen.add(box)
        main.append(ax)
    rows: dict[tuple[Axes, ...], None] = {}
    for ax in main:
        pos = ax.get_position()
        yc = (pos.y0 + pos.y1) / 2
        row = [b for b in main if b.get_position().y0 <= yc <= b.get_position().y1]
        rows[tuple(sorted(row, key=lambda b: b.get_position().x0))] = None
    return sorted((list(r) for r in rows), key=len, reverse=True)


def check_figure_readable(
    fig: Figure,
    column_px: float = COLUMN_PX,
    min_text_px: float = MIN_TEXT_PX,
    max_panels_per_row: int = MAX_PANELS_PER_ROW,
    dpi: float | None = None,
) -> list[str]:
    """What a reader could not read in ``fig`` at the size the book shows it, one message per problem (empty: ok).

    ``fig`` is saved as the inline backend saves it (``dpi``, default ``fig.dpi``; tight bounding box); it is
    shown at ``scale = min(1, column_px / saved width)``. Problems: each drawn text (tick and axis labels,
    titles, legends, annotations, colour-bar labels, the suptitle; empty and invisible texts are not drawn)
    whose height ``fontsize / 72 * dpi * scale`` is below ``min_text_px``; each row of panels (the main axes,
    grouped by vertical position; colour bars, insets, twins and empty cells are not panels) with more than
    ``max_panels_per_row`` panels, unless none of them draws tick labels: a strip of pictures (a grid of digits,
    reconstructions, maps drawn over the input) may hold more.
    """
    dpi = float(dpi or fig.dpi)
    width, texts = _saved(fig, dpi)
    scale = min(1.0, column_px / width)
    problems: list[str] = []  # the rows first (the layout), then each text
    drawn = {id(t) for t in texts}
    reported: list[set[int]] = []
    for row in _rows(fig):
        ids = {id(ax) for ax in row}
        if len(row) <= max_panels_per_row or any(ids <= r for r in reported):
            continue
        if not any(_has_ticklabels(ax, drawn) for ax in row):
            continue  # a strip of pictures (digits, reconstructions, maps over an image): no chart to read
        reported.append(ids)
        names = [ax.get_title() or ax.get_ylabel() or ("picture" if ax.images else "untitled") for ax in row]
        problems.append(f"{len(row)} panels in one row (> {max_panels_per_row}): {names}")
    kinds = _kinds(fig)
    for t in texts:
        px = t.get_fontsize() / 72 * dpi * scale
        if px < min_text_px - 1e-6:
            label = t.get_text().replace("\n", " ")
            problems.append(
                f"{kinds.get(id(t), 'text')} {label[:40]!r}: {t.get_fontsize():g} pt is {px:.1f} px at display "
                f"size (< {min_text_px:g} px; figure {width} px wide at {dpi:g} dpi, shown at "
                f"{min(width, column_px):.0f} px)"
            )
    return problems
