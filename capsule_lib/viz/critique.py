"""Figures of the chapter "Do capsules need routing?": routed against fixed couplings, what test-time iterations do,
the routing layer by layer, and one image's routing per iteration (the explorer's frame and its static twin).

Every function draws what :mod:`capsule_lib.critique` measured (:class:`~capsule_lib.routing_critique.Measured`,
:class:`~capsule_lib.routing_critique.DepthPoint`, :class:`~capsule_lib.critique.RoutingChanges`,
:class:`~capsule_lib.critique.LayerRouting`, :class:`~capsule_lib.critique.ImageRouting`); none runs a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .._contracts import checked
from ..critique import ImageRouting, LayerRouting, RoutingChanges
from .data import to_display
from .plots import finish_figure

__all__ = [
    "COUPLING_STYLES",
    "plot_couplings_compared",
    "plot_routing_changes",
    "plot_layers",
    "plot_depth_series",
    "plot_first_steps",
    "plot_rerouted_image",
    "plot_image_iterations",
]

#: how each coupling scheme is drawn (label, colour)
COUPLING_STYLES: dict[str, tuple[str, str]] = {
    "routed": ("routed (the algorithm)", "C0"),
    "uniform": ("uniform couplings", "C1"),
    "random": ("random couplings", "C2"),
}


@checked
def plot_couplings_compared(
    panels: Mapping[str, Mapping[str, Mapping[str, Any]]], labels: Mapping[str, str], title: str = ""
) -> Figure:
    """One panel per metric: ``panels`` maps a panel title to ``routing kind -> coupling scheme ->``
    :class:`~capsule_lib.routing_critique.Measured` (accuracies: ``mean`` and ``se``); a bar per scheme
    (:data:`COUPLING_STYLES`) with its mean and an error bar of two standard errors.
    ``labels``: routing kind -> its name on the axis. At most three panels (one row)."""
    if not 1 <= len(panels) <= 3:
        raise ValueError(f"one to three panels, got {len(panels)}")
    fig, axes = plt.subplots(1, len(panels), figsize=(3.0 * len(panels), 3.4), squeeze=False)
    for ax, (name, by_kind) in zip(axes[0], panels.items()):
        kinds = list(by_kind)
        w = 0.8 / len(COUPLING_STYLES)
        lo = 100.0
        for k, (scheme, (label, color)) in enumerate(COUPLING_STYLES.items()):
            xs = [i + (k - 1) * w for i, kind in enumerate(kinds) if scheme in by_kind[kind]]
            ms = [by_kind[kind][scheme] for kind in kinds if scheme in by_kind[kind]]
            ax.bar(
                xs,
                [100 * m.mean for m in ms],
                w,
                yerr=[200 * m.se for m in ms],
                color=color,
                label=label,
                capsize=2,
                error_kw={"lw": 0.8},
            )
            lo = min([lo, *(100 * (m.mean - 2 * m.se) for m in ms)])
        ax.set_xticks(range(len(kinds)), [labels.get(k, k) for k in kinds], rotation=35, ha="right", fontsize=8)
        ax.set_ylim(max(0.0, lo - 0.15 * (100 - lo) - 0.5), 100)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
        ax.tick_params(labelsize=8)
    axes[0][0].set_ylabel("accuracy (%), ± 2 s.e.", fontsize=8)
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=8, frameon=False)
    return finish_figure(fig, title, rect=(0, 0.07, 1, 1))


@checked
def plot_routing_changes(changes: Mapping[str, RoutingChanges], title: str = "") -> Figure:
    """Left: the share of images whose prediction differs from the one-pass prediction (uniform couplings, ``T =
    1``) against the test-time iterations ``T``; right: the couplings' mean normalised entropy (1: uniform); one
    line per network, a square at the ``T`` it was trained with."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    for label, ch in changes.items():
        T = list(ch.iterations)
        (line,) = a0.plot(T, [100 * v for v in ch.changed_from_first], "o-", ms=3, label=label)
        a1.plot(T, [s.entropy for s in ch.stats], "o-", ms=3, color=line.get_color())
        if ch.default in T:
            k = T.index(ch.default)
            a0.plot([ch.default], [100 * ch.changed_from_first[k]], "s", ms=6, color=line.get_color())
            a1.plot([ch.default], [ch.stats[k].entropy], "s", ms=6, color=line.get_color())
    a0.set_ylabel("predictions changed from T = 1 (%)", fontsize=8)
    a1.set_ylabel("coupling entropy (1 = uniform)", fontsize=8)
    a1.set_ylim(0, 1.05)
    for ax in (a0, a1):
        ax.set_xlabel("routing iterations T at test time (square: as trained)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    handles, names = a0.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(3, len(names)), fontsize=8, frameon=False)
    return finish_figure(fig, title, rect=(0, 0.09 * (1 + (len(names) - 1) // 3), 1, 1))


@checked
def plot_layers(layers: Mapping[str, Sequence[LayerRouting]], title: str = "") -> Figure:
    """Each network's routing layers by depth (1 = nearest the image): the couplings' entropy, how much they vary
    between images, and the share of parents alive; one line per network and number of iterations ``T``."""
    fig, axes = plt.subplots(1, 3, figsize=(9.0, 3.3))
    keys = (
        ("entropy", "coupling entropy (1 = uniform)"),
        ("variation", "variation between images"),
        ("alive", "parents alive (share)"),
    )
    for n, (label, rows) in enumerate(layers.items()):
        for m, T in enumerate(sorted({r.iterations for r in rows})):
            rs = sorted((r for r in rows if r.iterations == T), key=lambda r: r.depth)
            style = dict(color=f"C{n}", ls=("-", "--", ":", "-.")[m % 4], marker="o", ms=3, label=f"{label}, T = {T}")
            for ax, (key, _) in zip(axes, keys):
                ax.plot([r.depth for r in rs], [getattr(r.stats, key) for r in rs], **style)
    for ax, (_, name) in zip(axes, keys):
        ax.set_ylabel(name, fontsize=8)
        ax.set_xlabel("routing layer (1 = nearest the image)", fontsize=8)
        ax.xaxis.set_major_locator(plt.MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    axes[0].set_ylim(0, 1.05)
    axes[2].set_ylim(0, 1.05)
    handles, names = axes[0].get_legend_handles_labels()
    ncol = min(3, len(names))
    fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    return finish_figure(fig, title, rect=(0, 0.07 * (1 + (len(names) - 1) // ncol), 1, 1))


def _coupling_maps(couplings: torch.Tensor, grid: tuple[int, int, int]) -> np.ndarray:
    """``couplings [n_inp, K]`` of capsules ``i = (t*g + y)*g + x`` -> ``[K, g, g]``: each parent's coupling from each
    position, averaged over the types, times ``K`` (1: the uniform share)."""
    types, h, w = grid
    K = couplings.shape[-1]
    return (couplings.reshape(types, h, w, K).mean(0).permute(2, 0, 1) * K).float().numpy()


@checked
def plot_depth_series(series: Mapping[int, Any], title: str = "") -> Figure:
    """The depth series (routing layers -> :class:`~capsule_lib.routing_critique.DepthPoint`): left, MNIST test and
    affine accuracy against the number of routing layers (± 2 standard errors); right, the RMS gradient of each
    routing layer's weights (log scale) against its place, 1 = nearest the image, one line per depth."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.4, 3.2))
    depths = sorted(series)
    for key, label in (("test_acc", "MNIST test"), ("affine_acc", "affine MNIST")):
        ms = [series[d].accuracy[key] for d in depths]
        a0.errorbar(
            depths, [100 * m.mean for m in ms], [200 * m.se for m in ms], marker="o", ms=3, capsize=2, label=label
        )
    a0.set_xlabel("routing layers", fontsize=8)
    a0.set_ylabel("accuracy (%), ± 2 s.e.", fontsize=8)
    a0.legend(fontsize=8, frameon=False)
    for d in depths:
        g = series[d].gradients
        a1.semilogy(range(1, len(g) + 1), g, "o-", ms=3, label=f"{d} routing layer{'s' * (d > 1)}")
    a1.set_xlabel("routing layer (1 = nearest the image)", fontsize=8)
    a1.set_ylabel("RMS gradient of its weights", fontsize=8)
    a1.legend(fontsize=8, frameon=False)
    for ax in (a0, a1):
        ax.set_xticks(depths)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    return finish_figure(fig, title)


@checked
def plot_first_steps(runs: Mapping[str, Mapping[str, Any]], title: str = "", smooth: int = 10) -> Figure:
    """The first training steps of several runs (label -> :func:`capsule_lib.learning.first_steps`' result, e.g. read
    from ``benchmarks/results/learning_<diagnosis>.json``): the training loss (a running mean over ``smooth``
    steps), the accuracy on the probe's validation images, and the RMS gradient of the layer nearest the image (log
    scale), against the step."""
    if not runs:
        raise ValueError("no runs to draw")
    fig, axes = plt.subplots(1, 3, figsize=(9.0, 3.0))
    for i, (label, r) in enumerate(runs.items()):
        loss = np.asarray(r["loss"], dtype=float)
        k = max(1, min(smooth, len(loss)))
        run_mean = np.convolve(loss, np.ones(k) / k, mode="valid")
        style = dict(color=f"C{i % 10}", lw=1.2, label=label)
        axes[0].plot(np.arange(k, len(loss) + 1), run_mean, **style)
        steps = [p["step"] for p in r["probes"]]
        axes[1].plot(steps, [100 * p["val_acc"] for p in r["probes"]], marker="o", ms=2, **style)
        grads = [(p["step"], next(iter(p["grad_rms"].values()))) for p in r["probes"] if p.get("grad_rms")]
        if grads:
            axes[2].semilogy(*zip(*[(t, max(g, 1e-30)) for t, g in grads]), marker="o", ms=2, **style)
    for ax, ylabel in zip(
        axes, (f"training loss (mean of {smooth} steps)", "probe validation accuracy (%)", "RMS gradient, first layer")
    ):
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = min(len(labels), 2)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    legend_rows = -(-len(labels) // ncol)
    fig.set_size_inches(9.0, 3.0 + 0.22 * legend_rows)
    return finish_figure(fig, title, rect=(0, 0.075 * legend_rows / (1 + 0.07 * legend_rows) + 0.02, 1, 1))


def plot_rerouted_image(
    image: torch.Tensor,
    routing: ImageRouting,
    index: int,
    grid: tuple[int, int, int] = (16, 6, 6),
    classes: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """One image routed with ``routing.iterations[index]`` iterations: the image, the class scores (the predicted
    class in red), and for every parent (class) its coupling from each position of the primary grid (``grid`` =
    types, height, width), averaged over the types and scaled so that 1 is the uniform share."""
    T = routing.iterations[index]
    scores = routing.scores[index].float()
    K = scores.shape[0]
    names = list(classes) if classes is not None else [str(k) for k in range(K)]
    maps = _coupling_maps(routing.couplings[index], grid)
    per_row = (K + 1) // 2  # the parents' maps in two rows
    fig = plt.figure(figsize=(8.0, 5.2))
    gs = fig.add_gridspec(3, 2 * per_row, height_ratios=(1.5, 1.0, 1.0))
    ax_img = fig.add_subplot(gs[0, :3])
    ax_img.imshow(to_display(image), cmap="gray")
    ax_img.set_axis_off()
    ax = fig.add_subplot(gs[0, 3:])
    pred = int(scores.argmax())
    ax.bar(range(K), scores.numpy(), color=["C3" if k == pred else "C0" for k in range(K)])
    ax.set_xticks(range(K), names, fontsize=9)
    ax.set_ylabel(routing.score_kind, fontsize=9)
    ax.tick_params(labelsize=9)
    ax.set_title(f"T = {T}: predicts {names[pred]}; coupling entropy {routing.entropy[index]:.3f}", fontsize=10)
    hi = max(2.0, float(np.abs(maps - 1).max()) + 1)
    for k in range(K):
        r, c = divmod(k, per_row)
        a = fig.add_subplot(gs[1 + r, 2 * c : 2 * c + 2])
        a.imshow(maps[k], cmap="RdBu_r", vmin=2 - hi, vmax=hi)
        a.set_xticks([])
        a.set_yticks([])
        for side in a.spines.values():  # a frame: a uniform map is white
            side.set_visible(True)
            side.set_color("0.6")
        a.set_title(f"class {names[k]}", fontsize=9)
    fig.text(
        0.5,
        0.01,
        f"couplings to each class from each position (x {K}; white = uniform, red = more)",
        ha="center",
        fontsize=9,
    )
    return finish_figure(fig, title, rect=(0, 0.05, 1, 1))


@checked
def plot_image_iterations(routing: ImageRouting, classes: Sequence[str] | None = None, title: str = "") -> Figure:
    """One image against the test-time iterations: every class score (the classes that win at some ``T``
    labelled), and the couplings' mean normalised entropy (polarisation: 1 = uniform)."""
    T = list(routing.iterations)
    S = routing.scores.float().numpy()  # [T, K]
    names = list(classes) if classes is not None else [str(k) for k in range(S.shape[1])]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.0, 3.0))
    winners = sorted(set(routing.predictions))
    for k in range(S.shape[1]):
        lead = k in winners
        a0.plot(
            T,
            S[:, k],
            "o-" if lead else "-",
            ms=3,
            lw=1.5 if lead else 0.8,
            color=None if lead else "0.7",
            label=f"class {names[k]}" if lead else None,
        )
    a0.set_ylabel(f"class scores ({routing.score_kind})", fontsize=8)
    a0.legend(fontsize=8)
    a1.plot(T, routing.entropy, "o-", ms=3)
    a1.set_ylabel("coupling entropy (1 = uniform)", fontsize=8)
    a1.set_ylim(0, 1.05)
    for ax in (a0, a1):
        ax.set_xlabel("routing iterations T", fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
    return finish_figure(fig, title)
