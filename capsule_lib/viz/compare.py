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
from matplotlib.ticker import FuncFormatter

from .._contracts import checked
from .plots import finish_figure

__all__ = [
    "pareto_front",
    "plot_pareto",
    "plot_robustness",
    "plot_budget_curves",
    "plot_iteration_sweeps",
    "plot_routing_costs",
]


def _human(v: float, _pos: object = None) -> str:
    """A tick label: 400k, 1.5M, 250."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if v >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


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


@checked
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
    fig, axs = plt.subplots(1, len(axes), figsize=(max(4.3 * len(axes), 5.0), 3.6), squeeze=False)
    for ax, (key, label, lower) in zip(axs[0], axes):
        for r in rows:
            ax.scatter(r[key], 100 * r[y], s=30, zorder=3)
            ax.annotate(r["model"], (r[key], 100 * r[y]), fontsize=8, xytext=(4, 3), textcoords="offset points")
        names = pareto_front(rows, key, y, lower)
        front = [next(r for r in rows if r["model"] == n) for n in names]
        ax.plot([r[key] for r in front], [100 * r[y] for r in front], "--", color="0.4", lw=1, label="Pareto front")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_human))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: _human(v) if str(round(v))[0] in "25" else ""))
        ax.tick_params(axis="both", which="both", labelsize=8)
        ax.set_xlabel(label + (" (fewer is better)" if lower else " (more is better)"), fontsize=9)
        ax.set_ylabel(f"{y} (%)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return finish_figure(fig, title)


@checked
def plot_robustness(
    rows: Sequence[dict[str, Any]],
    clean: str,
    shifted: str,
    title: str = "",
    labels: tuple[str, str] | None = None,
) -> Figure:
    """Accuracy on the ``clean`` and the ``shifted`` test set (row keys) per model, with the drop in points;
    ``labels``: the two sets' names in the legend (default: the keys)."""
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(rows)), 3.4))
    xs = range(len(rows))
    w = 0.38
    names = labels or (clean, shifted)
    ax.bar([i - w / 2 for i in xs], [100 * r[clean] for r in rows], w, label=names[0])
    ax.bar([i + w / 2 for i in xs], [100 * r[shifted] for r in rows], w, label=names[1])
    for i, r in enumerate(rows):
        drop = 100 * (r[clean] - r[shifted])
        ax.annotate(f"-{drop:.1f}", (i + w / 2, 100 * r[shifted]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(xs), [r["model"] for r in rows], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("accuracy (%)", fontsize=8)
    top = max(100 * max(r[clean], r[shifted]) for r in rows) if rows else 100
    ax.set_ylim(0, top * 1.2)  # room for the legend above the bars
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    ax.grid(alpha=0.3, axis="y")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


@checked
def plot_budget_curves(
    histories: dict[str, Any],
    title: str = "",
    references: dict[str, float] | None = None,
    ylim: tuple[float, float] | None = None,
) -> Figure:
    """Validation accuracy against training wall time (minutes, validation included) for each run of
    ``histories`` (label -> :class:`~capsule_lib.train.checkpoint.History`), one line per run; a partial last epoch (a
    budget stop) is drawn as an open marker. ``references``: label -> an accuracy in % drawn as a dashed horizontal
    line (e.g. a paper's test accuracy); ``ylim``: the accuracy axis' range in %."""
    fig, ax = plt.subplots(figsize=(7.0, 3.4))
    for i, (label, value) in enumerate((references or {}).items()):
        ax.axhline(value, ls="--", lw=1, color=f"C{7 + i % 3}", label=label)
    for label, hist in histories.items():
        recs = [r for r in hist.records if "val_acc" in r and "wall_time" in r]
        if not recs:
            continue
        t = [r["wall_time"] / 60 for r in recs]
        acc = [100 * r["val_acc"] for r in recs]
        (line,) = ax.plot(t, acc, "o-", ms=3, label=label)
        if recs[-1].get("partial"):
            ax.plot(t[-1:], acc[-1:], "o", ms=7, mfc="none", color=line.get_color())
    ax.set_xlabel("training wall time, validation included (minutes)", fontsize=8)
    ax.set_ylabel("validation accuracy (%)", fontsize=8)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


@checked
def plot_iteration_sweeps(
    sweeps: dict[str, Sequence[dict[str, Any]]], trained: dict[str, int] | None = None, title: str = ""
) -> Figure:
    """Test accuracy (left) and forward time per image (right) against the routing iterations used at test time,
    one line per model: ``sweeps`` maps a label to :func:`~capsule_lib.evaluation.iteration_sweep` rows; a filled
    square marks the iterations each model was trained with (``trained``: label -> T)."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(9.0, 3.2))
    for label, rows in sweeps.items():
        T = [r["iterations"] for r in rows]
        (line,) = a0.plot(T, [100 * r["accuracy"] for r in rows], "o-", ms=3, label=label)
        a1.plot(T, [r["ms_per_image"] for r in rows], "o-", ms=3, label=label, color=line.get_color())
        if trained and label in trained:
            r = next((r for r in rows if r["iterations"] == trained[label]), None)
            if r is not None:
                a0.plot([r["iterations"]], [100 * r["accuracy"]], "s", ms=7, color=line.get_color())
    a0.set_ylabel("test accuracy (%)", fontsize=8)
    a1.set_ylabel("ms per image (forward)", fontsize=8)
    for ax in (a0, a1):
        ax.set_xlabel("routing iterations at test time (square: as trained)", fontsize=8)
        ax.set_xticks(sorted({r["iterations"] for rows in sweeps.values() for r in rows}))
        ax.grid(alpha=0.3)
    handles, names = a0.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(len(names), 3), fontsize=8, frameon=False)
    return finish_figure(fig, title, rect=(0, 0.08 * (1 + (len(names) - 1) // 3), 1, 1))


@checked
def plot_routing_costs(rows: Sequence[dict[str, Any]], title: str = "") -> Figure:
    """The routing layers alone (rows of :func:`~capsule_lib.cost.routing_scaling`, with ``sweep`` = ``"size"``
    or ``"iterations"`` as ``benchmarks/routing_scaling.py`` writes them): forward + backward time (top) and peak
    memory (bottom, where measured) against the input capsules, the output capsules and the iterations, log-log,
    one colour per algorithm, fp32 solid and bf16 autocast dashed."""
    size = [r for r in rows if r.get("sweep", "size") == "size"]
    its = [r for r in rows if r.get("sweep") == "iterations"]

    def common(rs: Sequence[dict[str, Any]], key: str) -> int:
        vals = [r[key] for r in rs]
        return max(set(vals), key=vals.count)

    peak = all(r.get("peak_mib") is not None for r in rows)
    panels = [("n_inp", size, "n_out"), ("n_out", size, "n_inp"), ("iterations", its, None)]
    panels = [p for p in panels if p[1]]
    metrics = [("ms", "forward + backward (ms)")] + ([("peak_mib", "peak memory (MiB)")] if peak else [])
    fig, axes = plt.subplots(
        len(metrics),
        len(panels),
        figsize=(3.0 * len(panels), 2.7 * len(metrics) + 0.8),
        squeeze=False,
        layout="constrained",
    )
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    colours = {k: f"C{i}" for i, k in enumerate(kinds)}
    for col, (xkey, rs, fixed_key) in enumerate(panels):
        fixed = common(rs, fixed_key) if fixed_key else None
        for row, (ykey, ylabel) in enumerate(metrics):
            ax = axes[row, col]
            for kind in kinds:
                for amp, style in ((None, "-"), ("bf16", "--")):
                    pts = sorted(
                        (r[xkey], r[ykey])
                        for r in rs
                        if r["kind"] == kind and r.get("amp") == amp and (fixed_key is None or r[fixed_key] == fixed)
                    )
                    if len(pts) < 2:
                        continue
                    xs, ys = zip(*pts)
                    label = kind + (" (bf16)" if amp else "") if col == 0 and row == 0 else None
                    ax.plot(xs, ys, style, marker="o", ms=3, color=colours[kind], label=label)
            ax.set_xscale("log" if xkey != "iterations" else "linear")
            ax.set_yscale("log")
            ticks = sorted({r[xkey] for r in rs})
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.xaxis.set_minor_locator(plt.NullLocator())
            where = f" ({fixed_key} = {fixed})" if fixed_key else (f" (at {rs[0]['n_inp']} -> {rs[0]['n_out']})")
            ax.set_xlabel(xkey + where, fontsize=8)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3, which="both")
    if axes[0, 0].get_lines():  # one legend for every panel, under them (it would hide a 3-in panel's lines)
        fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="outside lower center", ncol=4, fontsize=8)
    return finish_figure(fig, title, layout=False)
