"""Figures of the comparison chapter: accuracy against cost with the Pareto front, and robustness drops.

Both take plain rows (dicts), one per model, so they draw whatever the chapter computed or read from a labelled
artefact: ``{"model": ..., "accuracy": ..., "params": ..., "train_img_per_s": ...}`` and, for the robustness
figure, one accuracy per test set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

__all__ = ["pareto_front", "plot_pareto", "plot_robustness"]


def pareto_front(rows: Sequence[dict[str, Any]], x: str, y: str = "accuracy", lower_x: bool = True) -> list[str]:
    """The models no other model beats on both ``x`` and ``y`` (higher ``y`` is better; lower ``x`` is better
    when ``lower_x``, e.g. parameters, higher otherwise, e.g. throughput), in order of ``x``."""

    def better_or_equal(a: dict, b: dict) -> bool:  # a at least as good as b on both axes
        bx = a[x] <= b[x] if lower_x else a[x] >= b[x]
        return bx and a[y] >= b[y]

    front = [
        r for r in rows if not any(better_or_equal(o, r) and (o[x], o[y]) != (r[x], r[y]) for o in rows if o is not r)
    ]
    return [r["model"] for r in sorted(front, key=lambda r: r[x])]


def plot_pareto(
    rows: Sequence[dict[str, Any]],
    axes: Sequence[tuple[str, str, bool]] = (
        ("params", "parameters", True),
        ("train_img_per_s", "training throughput (images/s)", False),
    ),
    y: str = "accuracy",
    title: str = "",
) -> Figure:
    """One panel per ``(key, label, lower_is_better)`` of ``axes``: every model as a labelled point of
    ``y`` (in %) against that cost on a log axis, the Pareto front (:func:`pareto_front`) joined by a line."""
    fig, axs = plt.subplots(1, len(axes), figsize=(5.0 * len(axes), 3.6), squeeze=False)
    for ax, (key, label, lower) in zip(axs[0], axes):
        for r in rows:
            ax.scatter(r[key], 100 * r[y], s=30, zorder=3)
            ax.annotate(r["model"], (r[key], 100 * r[y]), fontsize=7, xytext=(4, 3), textcoords="offset points")
        names = pareto_front(rows, key, y, lower)
        front = [next(r for r in rows if r["model"] == n) for n in names]
        ax.plot([r[key] for r in front], [100 * r[y] for r in front], "--", color="0.4", lw=1, label="Pareto front")
        ax.set_xscale("log")
        ax.set_xlabel(label + (" (fewer is better)" if lower else " (more is better)"), fontsize=8)
        ax.set_ylabel(f"{y} (%)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_robustness(rows: Sequence[dict[str, Any]], clean: str, shifted: str, title: str = "") -> Figure:
    """Accuracy on the ``clean`` and the ``shifted`` test set (row keys) per model, with the drop in points."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows)), 3.4))
    xs = range(len(rows))
    w = 0.38
    ax.bar([i - w / 2 for i in xs], [100 * r[clean] for r in rows], w, label=clean)
    ax.bar([i + w / 2 for i in xs], [100 * r[shifted] for r in rows], w, label=shifted)
    for i, r in enumerate(rows):
        drop = 100 * (r[clean] - r[shifted])
        ax.annotate(f"-{drop:.1f}", (i + w / 2, 100 * r[shifted]), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), [r["model"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)", fontsize=8)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
