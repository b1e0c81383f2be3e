"""Figures of the primer's toy 2-D routing problems.

The problems come from :func:`~capsule_lib.analysis.toy_votes` (votes ``[B, n_inp, n_out, 2]`` where groups
of children agree on one parent each and a few outliers agree with nobody). The figures consume a
:class:`~capsule_lib.types.RoutingTrace` recorded once (``return_routing=True``) or the results of
:func:`~capsule_lib.analysis.outlier_sweep`; they never run routing. Iterations are 1-based: panel ``t``
shows the coefficients used in iteration ``t`` and the parents they produced.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .._contracts import checked
from ..analysis import PARENT_NAMES, ToyVotes, group_shares
from ..types import RoutingTrace
from .plots import _np, _unit_circle

__all__ = [
    "draw_routing_panel",
    "plot_routing_state",
    "plot_toy_iterations",
    "routing_readout",
    "plot_outlier_sweep",
]

_GROUP_COLORS = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink"]
_OUTLIER_COLOR = "0.45"


def _check_t(trace: RoutingTrace, t: int) -> None:
    if not 1 <= t <= trace.iterations:
        raise ValueError(f"iteration {t} out of range 1..{trace.iterations}")


def draw_routing_panel(
    ax: Axes, toy: ToyVotes, trace: RoutingTrace, t: int, j: int, sample: int = 0, label_parent: bool = True
) -> None:
    """One parent ``j`` in iteration ``t``: its votes (dot size and opacity = coefficient ``c_ij``,
    colour = the child's group, grey = outlier) and the parent capsule ``v_j`` (black arrow).

    The title gives the iteration and ``|v_j|``; ``label_parent`` names the parent on the y axis.
    """
    _check_t(trace, t)
    u = _np(toy.votes[sample, :, j])  # [I, 2]
    c = _np(trace.coefficients[t - 1][sample, :, j])  # [I]
    v = _np(trace.outputs[t - 1][sample, j])  # [2]
    _unit_circle(ax)
    colors = [(_GROUP_COLORS[g % len(_GROUP_COLORS)] if g >= 0 else _OUTLIER_COLOR) for g in toy.group.tolist()]
    for k in range(u.shape[0]):
        ax.scatter(
            u[k, 0],
            u[k, 1],
            s=15 + 200 * c[k],
            color=colors[k],
            alpha=0.25 + 0.75 * float(c[k]),
            edgecolors="none",
            zorder=2,
        )
    ax.annotate("", xy=(v[0], v[1]), xytext=(0, 0), arrowprops=dict(arrowstyle="-|>", color="black", lw=2.0), zorder=3)
    name = PARENT_NAMES[j]
    ax.set_title(f"iteration {t}: $|v_{name}|$ = {np.hypot(*v):.2f}", fontsize="medium")
    if label_parent:
        ax.set_ylabel(f"parent {name}", fontsize="medium")
    ax.set(xlim=(-1.3, 1.3), ylim=(-1.3, 1.3), aspect="equal", xticks=[-1, 0, 1], yticks=[-1, 0, 1])
    ax.tick_params(labelsize="small")


def _group_legend(fig: Figure, toy: ToyVotes, fontsize: str = "small") -> None:
    from matplotlib.lines import Line2D

    keys = sorted(k for k in set(toy.group.tolist()) if k >= 0)
    handles = [
        Line2D(
            [],
            [],
            ls="",
            marker="o",
            color=_GROUP_COLORS[k % len(_GROUP_COLORS)],
            label=f"votes of group {PARENT_NAMES[k]}",
        )
        for k in keys
    ]
    if (toy.group < 0).any():
        handles.append(Line2D([], [], ls="", marker="o", color=_OUTLIER_COLOR, label="votes of outliers"))
    handles.append(Line2D([], [], color="black", lw=2, label="parent capsule $v_j$"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 2), fontsize=fontsize)


def _draw_shares(ax: Axes, toy: ToyVotes, trace: RoutingTrace, t: int, sample: int) -> None:
    c = _np(trace.coefficients[t - 1][sample])  # [I, J]
    labels = toy.child_labels()
    bottom = np.zeros(c.shape[0])
    for j in range(c.shape[1]):
        ax.bar(
            range(c.shape[0]),
            c[:, j],
            bottom=bottom,
            color=_GROUP_COLORS[j % len(_GROUP_COLORS)],
            label=f"to {PARENT_NAMES[j]}",
            width=0.8,
        )
        bottom += c[:, j]
    ax.set_xticks(range(c.shape[0]), labels)
    ax.set(ylim=(0, 1.25), yticks=np.linspace(0, 1, 6), ylabel=r"$c_{ij}$", title=f"coefficients used in iteration {t}")
    ax.grid(False)
    ax.legend(loc="upper right", ncol=c.shape[1], handlelength=1.0, columnspacing=1.0)


def plot_routing_state(toy: ToyVotes, trace: RoutingTrace, t: int, sample: int = 0) -> Figure:
    """The state of routing in iteration ``t``: one panel per parent plus each child's coefficients.

    The static twin of :func:`capsule_lib.viz.widgets.routing_explorer` (the slider sets ``t``). Two parents: one
    row of three panels; more: the parents in rows of at most three, the coefficients below them. Every text is
    at least 10 pt, so the figure stays readable as a page-mode frame saved at 60 dpi.
    """
    _check_t(trace, t)
    J = toy.n_parents
    if J + 1 <= 3:
        fig, axes = plt.subplots(
            1, J + 1, figsize=(3.2 * J + 4.0, 3.6), layout="constrained", gridspec_kw={"width_ratios": [1] * J + [1.3]}
        )
        axes = list(axes)
    else:
        ncols, prow = 3, -(-J // 3)
        fig = plt.figure(figsize=(9.6, 3.2 * prow + 2.8), layout="constrained")
        gs = fig.add_gridspec(prow + 1, ncols, height_ratios=[1.0] * prow + [0.8])
        axes = [fig.add_subplot(gs[j // ncols, j % ncols]) for j in range(J)] + [fig.add_subplot(gs[prow, :])]
    for j in range(J):
        draw_routing_panel(axes[j], toy, trace, t, j, sample, label_parent=j % 3 == 0)
    _draw_shares(axes[J], toy, trace, t, sample)
    for ax in axes:
        ax.tick_params(labelsize="medium")
    _group_legend(fig, toy, fontsize="medium")
    return fig


@checked
def plot_toy_iterations(
    toy: ToyVotes, trace: RoutingTrace, iterations: Sequence[int] | None = None, sample: int = 0
) -> Figure:
    """All requested iterations side by side: rows = parents, columns = iterations (default: all).

    Each panel is the one :func:`plot_routing_state` draws for that iteration and parent. More than three
    iterations wrap: the next three columns form a new block of rows below (``fig.axes`` stays parent-major).
    """
    its = list(iterations) if iterations is not None else list(range(1, trace.iterations + 1))
    for t in its:
        _check_t(trace, t)
    J = toy.n_parents
    ncols, blocks = min(len(its), 3), -(-len(its) // 3)
    fig = plt.figure(figsize=(0.4 + 2.3 * ncols, 0.5 + 2.3 * J * blocks), layout="constrained")
    gs = fig.add_gridspec(J * blocks, ncols)
    for j in range(J):
        for col, t in enumerate(its):
            ax = fig.add_subplot(gs[(col // 3) * J + j, col % 3])
            draw_routing_panel(ax, toy, trace, t, j, sample, label_parent=col % 3 == 0)
    _group_legend(fig, toy)
    return fig


@checked
def routing_readout(toy: ToyVotes, trace: RoutingTrace, t: int, sample: int = 0) -> str:
    """One short line for iteration ``t``: parent lengths and the share each group sends to its parent,
    ``"iteration <t>: |v_A|=<length> |v_B|=...; A→A <share>%, B→B ...; outliers→A/B <shares>%"``."""
    _check_t(trace, t)
    v = trace.outputs[t - 1][sample]  # [J, 2]
    lengths = torch.linalg.vector_norm(v.float(), dim=-1).tolist()
    names = toy.parent_names()
    head = f"iteration {t}: " + " ".join(f"|v_{n}|={x:.2f}" for n, x in zip(names, lengths))
    shares = group_shares(toy, trace, t, sample)
    keys = sorted(k for k in set(toy.group.tolist()) if k >= 0)
    parts = [head, ", ".join(f"{names[k]}→{names[k]} {100 * shares[row, k]:.0f}%" for row, k in enumerate(keys))]
    if (toy.group < 0).any():
        parts.append(f"outliers→{'/'.join(names)} " + "/".join(f"{100 * x:.0f}" for x in shares[-1]) + "%")
    return "; ".join(p for p in parts if p)


@checked
def plot_outlier_sweep(sweep: dict[str, np.ndarray]) -> Figure:
    """The results of :func:`~capsule_lib.analysis.outlier_sweep` in two panels (plain / leaky routing): mean
    length of parent A (agreed on) and parent B (agreed on by nobody) against the number of outliers, one line
    style per number of iterations."""
    fig, axes = plt.subplots(1, 2, figsize=(7.0, 3.6), sharey=True, constrained_layout=True)
    styles = ["-o", "--s", ":^", "-.v"]
    for b, (ax, name) in enumerate(zip(axes, ("plain routing", "leaky routing"))):
        for k, T in enumerate(sweep["iterations"]):
            st = styles[k % len(styles)]
            for j, parent in enumerate("AB"):
                lengths = sweep["lengths"][:, b, k, j]
                label = f"$|v_{parent}|$, {T} it."
                ax.plot(sweep["n_outliers"], lengths, st, color=_GROUP_COLORS[j], ms=4, label=label)
        ax.set(title=name, xlabel="number of outliers", ylim=(0, 1))
    axes[0].set_ylabel("mean parent length")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize="small")
    return fig
