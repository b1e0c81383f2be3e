"""Generic static figures: squash curves, capsule vectors, routing coefficients, training histories, and a
live training plot for notebooks.

Every function draws with matplotlib and returns the ``Figure`` (the caller decides whether to show,
save or close it). Functions that take an ``ax`` draw into it instead of making a new figure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .._contracts import checked
from ..functional import capsule_lengths, squash_efficient, squash_hinton
from ..types import RoutingTrace

__all__ = [
    "set_style",
    "finish_figure",
    "plot_squash",
    "plot_capsules",
    "plot_coefficients",
    "plot_history",
    "LivePlot",
    "history_records",
    "BOOK_STYLE",
    "COLUMN_PX",
]

#: width (px) of the book's content column, where every figure is shown, measured in Chromium on the built
#: book (sphinx-book-theme, 1280 px wide viewport, ``book/routing_compared.html``): the ``article`` is 752 px
#: wide with 32 px padding on each side, so a cell output (and an image in it) gets 688 px. A wider figure is
#: scaled down to it (``max-width: 100%``); :mod:`capsule_lib.viz.readability` checks text at that size.
COLUMN_PX = 688

#: matplotlib rcParams used by every figure of the book (applied by :func:`set_style`).
BOOK_STYLE: dict[str, Any] = {
    "figure.dpi": 100,
    "figure.figsize": (6.4, 4.0),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": "medium",
    "legend.frameon": False,
    "image.cmap": "viridis",
}


def set_style() -> None:
    """Apply :data:`BOOK_STYLE` to matplotlib's rcParams."""
    plt.rcParams.update(BOOK_STYLE)


def _np(x: torch.Tensor | np.ndarray | Sequence[float]) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def finish_figure(
    fig: Figure, title: str | None = None, *, fontsize: float = 10, layout: bool = True, **layout_kw: Any
) -> Figure:
    """How the book's figures end: the suptitle ``title`` (when given, at ``fontsize``), then, with ``layout``,
    ``fig.tight_layout(**layout_kw)``; returns ``fig``."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    if layout:
        fig.tight_layout(**layout_kw)
    return fig


@checked
def plot_squash(max_norm: float = 5.0, n: int = 400, ax: Axes | None = None) -> Figure:
    """Output length ``|v|`` against input length ``|s|`` for both squash functions.

    The curves are computed by :func:`~capsule_lib.functional.squash_hinton` and
    :func:`~capsule_lib.functional.squash_efficient` on 2-D vectors of growing length.
    """
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.0, 3.6))
    else:
        fig = ax.figure
    r = torch.linspace(0.0, max_norm, n)
    s = torch.stack([r, torch.zeros_like(r)], dim=-1)  # [n, 2]: vectors of length r
    for fn, label, style in (
        (squash_hinton, r"$\mathrm{squash}_H$ (Sabour et al. 2017)", "-"),
        (squash_efficient, r"$\mathrm{squash}_E$ (Mazzia et al. 2021)", "--"),
    ):
        ax.plot(_np(r), _np(capsule_lengths(fn(s))), style, lw=2, label=label)
    ax.plot(_np(r), np.minimum(_np(r), 1.0), ":", color="0.5", lw=1, label=r"$\min(|s|, 1)$")
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set(
        xlabel=r"input length $|s|$",
        ylabel=r"output length $|v|$",
        xlim=(0, max_norm),
        ylim=(0, 1.05),
        title="Squash keeps the direction and maps the length into [0, 1)",
    )
    ax.legend(loc="lower right")
    return fig


@checked
def plot_capsules(
    vectors: torch.Tensor | np.ndarray | Sequence[Sequence[float]],
    labels: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    colors: Sequence[Any] | None = None,
) -> Figure:
    """2-D capsules ``[n, 2]`` as arrows from the origin, with the unit circle (length 1 = certainty).

    Each arrow is labelled with its name (``labels``) and its length.
    """
    v = _np(vectors)
    if v.ndim != 2 or v.shape[1] != 2:
        raise ValueError(f"vectors: expected shape [n, 2], got {tuple(v.shape)}")
    if ax is None:
        fig, ax = plt.subplots(figsize=(4.2, 4.2))
    else:
        fig = ax.figure
    _unit_circle(ax)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, (x, y) in enumerate(v):
        c = colors[k] if colors is not None else cycle[k % len(cycle)]
        ax.annotate("", xy=(x, y), xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color=c, lw=2))
        name = labels[k] if labels is not None else f"capsule {k}"
        n = float(np.hypot(x, y))
        ux, uy = (x / n, y / n) if n > 1e-9 else (1.0, 0.0)
        ax.text(
            x + 0.12 * ux,
            y + 0.12 * uy,
            f"{name}\n|v| = {n:.2f}",
            color=c,
            fontsize="small",
            ha="left" if ux >= 0 else "right",
            va="bottom" if uy >= 0 else "top",
        )
    lim = max(1.25, float(np.abs(v).max()) * 1.3)
    ax.set(xlim=(-lim, lim), ylim=(-lim, lim), aspect="equal", title=title or "Capsules: length and direction")
    return fig


def _unit_circle(ax: Axes) -> None:
    t = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(t), np.sin(t), "--", color="0.6", lw=0.8)
    ax.axhline(0, color="0.8", lw=0.6, zorder=0)
    ax.axvline(0, color="0.8", lw=0.6, zorder=0)


@checked
def plot_coefficients(
    trace: RoutingTrace,
    sample: int = 0,
    iterations: Iterable[int] | None = None,
    child_labels: Sequence[str] | None = None,
    parent_labels: Sequence[str] | None = None,
) -> Figure:
    """Heatmaps of the routing coefficients ``c[i, j]`` of one sample, one panel per iteration.

    Works for every algorithm's :class:`~capsule_lib.types.RoutingTrace` with fully-connected
    coefficients ``[B, n_inp, n_out]``. ``iterations`` are 1-based (default: all).
    """
    if trace.iterations == 0:
        raise ValueError("the trace has no iterations (was it recorded with return_routing=True?)")
    its = list(iterations) if iterations is not None else list(range(1, trace.iterations + 1))
    for t in its:
        if not 1 <= t <= trace.iterations:
            raise ValueError(f"iteration {t} out of range 1..{trace.iterations}")
    fig, axes = plt.subplots(1, len(its), figsize=(2.2 + 1.9 * len(its), 3.6), squeeze=False, constrained_layout=True)
    im = None
    for ax, t in zip(axes[0], its):
        c = _np(trace.coefficients[t - 1][sample])  # [I, J]
        im = ax.imshow(c, vmin=0.0, vmax=1.0, aspect="auto", cmap="viridis")
        ax.set_title(f"iteration {t}")
        ax.grid(False)
        ax.set_xticks(range(c.shape[1]), parent_labels or [str(j) for j in range(c.shape[1])])
        ax.set_yticks(range(c.shape[0]), child_labels or [str(i) for i in range(c.shape[0])])
        ax.set_xlabel("parent j")
    axes[0][0].set_ylabel("child i")
    fig.colorbar(im, ax=list(axes[0]), label=r"$c_{ij}$", shrink=0.9)
    return fig


# ----------------------------------------------------------------------------------------- histories
def history_records(history: Any) -> list[Mapping[str, Any]]:
    """Records of a :class:`~capsule_lib.train.checkpoint.History`, a ``{"records": [...]}`` dict or a list."""
    if hasattr(history, "records"):
        return list(history.records)
    if isinstance(history, Mapping):
        return list(history.get("records", []))
    return list(history)


@checked
def plot_history(history: Any, title: str | None = None) -> Figure:
    """Loss and accuracy per epoch (train / val / test where recorded) of a training history.

    ``history``: a :class:`~capsule_lib.train.checkpoint.History`, its ``to_dict()`` or a list of records with
    ``epoch``, ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``, ``test_loss``, ``test_acc``.
    Missing keys are skipped; an empty history gives empty axes with a note.
    """
    recs = history_records(history)
    fig, (ax_l, ax_a) = plt.subplots(1, 2, figsize=(9.0, 3.4), constrained_layout=True)
    epochs = [r.get("epoch", k + 1) for k, r in enumerate(recs)]
    for split, style in (("train", "-o"), ("val", "-s"), ("test", ":^")):
        for ax, key in ((ax_l, f"{split}_loss"), (ax_a, f"{split}_acc")):
            pts = [(e, r[key]) for e, r in zip(epochs, recs) if r.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, style, ms=3, label=split)
    ax_l.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_a.set(xlabel="epoch", ylabel="accuracy", title="accuracy")
    for ax in (ax_l, ax_a):
        if ax.lines:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "no records yet", ha="center", va="center", transform=ax.transAxes, color="0.5")
    if title:
        fig.suptitle(title)
    return fig


class LivePlot:
    """:class:`~capsule_lib.train.trainer.Trainer` callback that redraws :func:`plot_history` after every epoch.

    In a notebook the figure is shown once and then updated in place through an IPython display handle,
    so a training run leaves one figure, not one per epoch::

        trainer = Trainer(model, objective, opt, callbacks=[LivePlot("CapsNet on MNIST")])

    ``every``: redraw every ``every`` epochs (the last epoch is not special-cased; call :meth:`redraw`).
    """

    @checked
    def __init__(self, title: str | None = None, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.title, self.every = title, every
        self.handle: Any = None
        self.history: Any = None
        self.draws = 0

    def __call__(self, trainer: Any, record: Mapping[str, Any]) -> None:
        self.history = trainer.history
        if len(self.history) % self.every == 0:
            self.redraw()

    def redraw(self) -> None:
        """Draw the current history and show it (first call) or update the shown figure."""
        from IPython.display import display

        fig = plot_history(self.history if self.history is not None else [], self.title)
        if self.handle is None:
            self.handle = display(fig, display_id=True)
        else:
            self.handle.update(fig)
        plt.close(fig)
        self.draws += 1
