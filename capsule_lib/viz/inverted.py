"""Figures of inverted dot-product attention routing (Tsai et al. 2020): the concurrent and sequential
schedules as diagrams, a convolutional capsule layer's window and routing probabilities, the class capsules'
attention maps over an image (static twin of :func:`~capsule_lib.viz.explorers.attention_explorer`), what the
official ``input_expansion`` bug reads, and accuracy / cost against the number of routing iterations.
The maps, the grids' geometry and the bug's sources are computed by :mod:`capsule_lib.analysis`
(:func:`~capsule_lib.analysis.class_attention_maps`, :func:`~capsule_lib.analysis.grid_geometry`,
:func:`~capsule_lib.analysis.expansion_sources`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle

from .._contracts import checked
from ..analysis import expansion_sources
from .data import to_display
from .plots import finish_figure

__all__ = [
    "plot_schedules",
    "plot_attention_maps",
    "attention_readout",
    "plot_conv_window",
    "plot_expansion_bug",
    "plot_iteration_sweep",
]


# ------------------------------------------------------------------------------------------- schedules
@checked
def plot_schedules(n_layers: int = 3, iterations: int = 3) -> Figure:
    """Which pose feeds which update, for ``n_layers`` capsule layers and ``T = iterations``, in the
    concurrent (Jacobi) and the sequential schedule of :meth:`~capsule_lib.models.CapsModel.route`.

    Node ``P_l^(t)`` is layer ``l``'s pose after its ``t``-th update (``P_0``, the primary capsules, never
    changes). Solid arrows: the input poses of an update (from the layer below); dashed: the previous pose of
    the same layer, the query of the agreement. The number in a node is the order in which it is computed;
    nodes with the same number can be computed at the same time."""
    L, T = n_layers, iterations
    fig, axes = plt.subplots(1, 2, figsize=(2.0 * T + 3.2, 0.9 * L + 1.9), squeeze=False)
    for ax, seq in zip(axes[0], (False, True)):
        order: dict[tuple[int, int], int] = {}
        edges: list[tuple[tuple[int, int], tuple[int, int], bool]] = []  # (src, dst, is_query)
        if not seq:
            for t in range(1, T + 1):
                for l in range(1, L + 1):
                    order[(l, t)] = l if t == 1 else L + t - 1  # the first pass climbs; later updates run together
                    src = (l - 1, t - 1 if t > 1 else 1) if l > 1 else (0, 0)
                    edges.append((src, (l, t), False))
                    if t > 1:
                        edges.append(((l, t - 1), (l, t), True))
        else:
            k = 0
            for l in range(1, L + 1):
                for t in range(1, T + 1):
                    k += 1
                    order[(l, t)] = k
                    edges.append(((l - 1, T) if l > 1 else (0, 0), (l, t), False))
                    if t > 1:
                        edges.append(((l, t - 1), (l, t), True))

        def xy(node: tuple[int, int]) -> tuple[float, float]:
            l, t = node
            return (0.0 if l == 0 else float(t)), float(l)

        for src, dst, query in edges:
            (x0, y0), (x1, y1) = xy(src), xy(dst)
            ax.add_patch(
                FancyArrowPatch(
                    (x0, y0),
                    (x1, y1),
                    arrowstyle="-|>",
                    mutation_scale=10,
                    shrinkA=14,
                    shrinkB=14,
                    linestyle="--" if query else "-",
                    color="tab:orange" if query else "tab:blue",
                    lw=1.2,
                )
            )
        ax.scatter([0], [0], s=700, color="0.85", edgecolor="k", zorder=3)
        ax.text(0, 0, "$P_0$", ha="center", va="center", fontsize=9, zorder=4)
        for (l, t), k in order.items():
            x, y = xy((l, t))
            ax.scatter([x], [y], s=700, color="white", edgecolor="k", zorder=3)
            ax.text(x, y + 0.04, f"$P_{l}^{{({t})}}$", ha="center", va="center", fontsize=9, zorder=4)
            ax.text(x + 0.2, y - 0.26, str(k), ha="left", va="center", fontsize=8, color="tab:red", zorder=4)
        ax.set_xlim(-0.6, T + 0.6)
        ax.set_ylim(-0.6, L + 0.6)
        ax.set_xticks(range(T + 1), ["fixed"] + [f"update {t}" for t in range(1, T + 1)], fontsize=8)
        ax.set_yticks(range(L + 1), ["primary"] + [f"layer {l}" for l in range(1, L + 1)], fontsize=8)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        steps = max(order.values())
        ax.set_title(
            f"{'sequential' if seq else 'concurrent (Jacobi)'}: {steps} dependent steps, {L * T} updates", fontsize=9
        )
    axes[0, 0].plot([], [], "-", color="tab:blue", label="input poses (layer below)")
    axes[0, 0].plot([], [], "--", color="tab:orange", label="query: previous pose of the layer")
    axes[0, 0].legend(fontsize=8, loc="upper left", frameon=False)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------- attention maps
def _overlay(ax, image: torch.Tensor, amap: np.ndarray, geometry: tuple[float, float, int], vmin: float, vmax: float):
    first, step, side = geometry
    ax.imshow(to_display(image))
    lo, hi = first - step / 2, first + step * (side - 1) + step / 2
    ax.add_patch(Rectangle((lo, lo), hi - lo, hi - lo, fill=False, ec="w", lw=0.8))
    im = ax.imshow(
        amap, cmap="viridis", alpha=0.75, vmin=vmin, vmax=vmax, extent=(lo, hi, hi, lo), interpolation="nearest"
    )
    ax.set_xlim(-0.5, image.shape[-1] - 0.5)  # the whole image, not just the grid's area
    ax.set_ylim(image.shape[-2] - 0.5, -0.5)
    return im


@checked
def plot_attention_maps(
    images: torch.Tensor,
    maps: torch.Tensor,
    classes: Sequence[str],
    geometry: tuple[float, float, int],
    targets: Sequence[int],
    labels: Sequence[int] | None = None,
    probs: torch.Tensor | None = None,
    iterations: Sequence[int] | None = None,
    title: str = "",
) -> Figure:
    """Rows: images; columns: the image, then for each update of the class layer the map of routing
    probabilities into class ``targets[n]`` (``maps [N, T, K, h, w]`` of
    :func:`~capsule_lib.analysis.class_attention_maps`), each cell drawn over its receptive field's centre
    (``geometry`` = ``grid_geometry(model)[-1]`` of :func:`~capsule_lib.analysis.grid_geometry`; the white square
    is the area the grid covers). ``probs [N, T, K]`` (optional): the class probabilities after each update, shown
    in the titles. One colour scale for the whole figure, spanning the values of the maps and ``1/K``, the
    uniform routing of the first pass."""
    N, T, K = maps.shape[:3]
    its = list(iterations) if iterations is not None else list(range(1, T + 1))
    sel = torch.stack([maps[n, :, int(targets[n])] for n in range(N)])  # [N, T, h, w]
    vmin, vmax = min(float(sel.min()), 1.0 / K), max(float(sel.max()), 1.0 / K)
    if vmax - vmin < 1e-6:
        vmin, vmax = vmin - 0.01, vmax + 0.01
    fig, axes = plt.subplots(
        N, T + 1, figsize=(1.75 * (T + 1) + 0.9, 1.8 * N + 0.6), squeeze=False, layout="constrained"
    )
    for n in range(N):
        head = "image"
        if labels is not None:
            head = f"true: {classes[int(labels[n])]}"
        axes[n, 0].imshow(to_display(images[n]))
        axes[n, 0].set_title(head, fontsize=8)
        tgt = int(targets[n])
        for t in range(T):
            im = _overlay(axes[n, t + 1], images[n], sel[n, t].numpy(), geometry, vmin, vmax)
            txt = f"update {its[t]}: -> {classes[tgt]}"
            if probs is not None:
                txt += f"\n(p={float(probs[n, t, tgt]):.2f})"
            axes[n, t + 1].set_title(txt, fontsize=7)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.04, pad=0.02, shrink=0.8).set_label(
        f"r (mean over types; uniform {1 / K:.2f})", fontsize=7
    )
    return finish_figure(fig, title, fontsize=9, layout=False)


def attention_readout(maps: torch.Tensor, probs: torch.Tensor, classes: Sequence[str], target: int) -> str:
    """One line for an explorer: ``"-> cat: p=0.81; routing to it: max 0.42 at (2, 3), mean 0.18 (uniform 0.10)"``
    for ``maps [K, h, w]`` (one update) and ``probs [K]``."""
    K, h, w = maps.shape
    m = maps[target]
    idx = int(m.argmax())
    return (
        f"-> {classes[target]}: p={float(probs[target]):.2f}; routing to it: max {float(m.max()):.2f} at "
        f"({idx // w}, {idx % w}), mean {float(m.mean()):.2f} (uniform {1 / K:.2f}); predicted "
        f"{classes[int(probs.argmax())]}"
    )


# -------------------------------------------------------------------------------------- conv windows
@checked
def plot_conv_window(
    image: torch.Tensor,
    coefficients: torch.Tensor,
    geometry_in: tuple[float, float, int],
    position: tuple[int, int],
    kernel_size: int,
    stride: int,
    n_inp: int,
    title: str = "",
) -> Figure:
    """A CONV capsule layer at one output position: left, the image with the input capsule grid and the
    ``k x k`` window that position routes from; right, its routing probabilities ``r [N*k*k, M]`` (rows: the
    window's children ``(type n, kernel row, kernel column)``, columns: the output capsule types; each row
    sums to 1). ``coefficients [h_out, w_out, N*k*k, M]`` is one image's entry of the layer's trace."""
    first, step, side = geometry_in
    y0, x0 = position
    r = coefficients[y0, x0].detach().float().cpu().numpy()  # [N*k*k, M]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.2, 3.8), gridspec_kw={"width_ratios": [1, 1.1]})
    a0.imshow(to_display(image))
    lo = first - step / 2
    for g in range(side + 1):
        a0.axhline(lo + g * step, color="w", lw=0.3, alpha=0.5)
        a0.axvline(lo + g * step, color="w", lw=0.3, alpha=0.5)
    wy, wx = lo + y0 * stride * step, lo + x0 * stride * step
    a0.add_patch(Rectangle((wx, wy), kernel_size * step, kernel_size * step, fill=False, ec="tab:red", lw=2))
    a0.set_xlim(-0.5, image.shape[-1] - 0.5)
    a0.set_ylim(image.shape[-2] - 0.5, -0.5)
    a0.set_xticks([])
    a0.set_yticks([])
    a0.set_title(
        f"input capsules ({side}x{side} grid, {n_inp} types each);\nred: the {kernel_size}x{kernel_size} window of "
        f"output position {position}",
        fontsize=8,
    )
    im = a1.imshow(r, aspect="auto", cmap="viridis", vmin=0, vmax=max(float(r.max()), 1e-6), interpolation="nearest")
    kk = kernel_size * kernel_size
    for n in range(1, n_inp):
        a1.axhline(n * kk - 0.5, color="w", lw=0.5)
    a1.set_yticks([n * kk + kk // 2 for n in range(n_inp)], [f"type {n}" for n in range(n_inp)], fontsize=7)
    a1.set_xticks(range(r.shape[1]), [str(m) for m in range(r.shape[1])], fontsize=7)
    a1.set_xlabel("output capsule type at this position", fontsize=8)
    a1.set_title(f"routing probabilities r: {r.shape[0]} children x {r.shape[1]} parents", fontsize=8)
    fig.colorbar(im, ax=a1, fraction=0.05, pad=0.02).set_label("r (rows sum to 1)", fontsize=7)
    return finish_figure(fig, title)


# ---------------------------------------------------------------------------------- the official bug
@checked
def plot_expansion_bug(size: int = 7, kernel_size: int = 3, stride: int = 2, d: int = 16) -> Figure:
    """What one output position's window reads under the correct expansion (``unfold``) and the official
    ``input_expansion`` (``official_bug``), on a ``size x size`` grid: for output positions (0, 0) and the
    last one, the input cells read (count of pose entries read from each cell), and in the titles the share
    of values that come from the right cell and the right pose entry."""
    fig, axes = plt.subplots(2, 2, figsize=(7.2, 6.4), squeeze=False)
    for row, expansion in enumerate(("unfold", "official_bug")):
        rows, cols, ents = expansion_sources(size, kernel_size, stride, d, expansion)
        good_r, good_c, good_e = expansion_sources(size, kernel_size, stride, d, "unfold")
        h_out = rows.shape[2]
        for col, (h, w) in enumerate(((0, 0), (h_out - 1, h_out - 1))):
            counts = np.zeros((size, size))
            rr, cc = rows[:, :, h, w].reshape(-1).numpy(), cols[:, :, h, w].reshape(-1).numpy()
            np.add.at(counts, (rr, cc), 1)
            right = (
                (rows[:, :, h, w] == good_r[:, :, h, w])
                & (cols[:, :, h, w] == good_c[:, :, h, w])
                & (ents[:, :, h, w] == good_e[:, :, h, w])
            )
            ax = axes[row, col]
            ax.imshow(counts, cmap="Blues", vmin=0, vmax=max(counts.max(), 1))
            for y in range(size):
                for x in range(size):
                    if counts[y, x]:
                        ax.text(x, y, str(int(counts[y, x])), ha="center", va="center", fontsize=7)
            ax.add_patch(
                Rectangle(
                    (w * stride - 0.5, h * stride - 0.5), kernel_size, kernel_size, fill=False, ec="tab:red", lw=1.5
                )
            )
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(
                f"{expansion}, output ({h}, {w}):\n{100 * float(right.float().mean()):.0f}% of the {right.numel()} "
                "values are the right ones",
                fontsize=8,
            )
    fig.suptitle(
        f"values read by a {kernel_size}x{kernel_size}, stride-{stride} window on a {size}x{size} grid, {d} pose "
        "entries per cell\n(red: the correct window; numbers: pose entries read from that cell)",
        fontsize=8,
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------ iteration sweep
@checked
def plot_iteration_sweep(rows: Sequence[dict[str, Any]], title: str = "") -> Figure:
    """Accuracy and time per image against the number of routing iterations, one line per schedule:
    ``rows`` from :func:`~capsule_lib.evaluation.iteration_sweep` (keys ``setting``, ``iterations``,
    ``accuracy``, ``ms_per_image``)."""
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(8.4, 3.0))
    for name in dict.fromkeys(r["setting"] for r in rows):
        rs = [r for r in rows if r["setting"] == name]
        T = [r["iterations"] for r in rs]
        a0.plot(T, [100 * r["accuracy"] for r in rs], "o-", label=name)
        a1.plot(T, [r["ms_per_image"] for r in rs], "o-", label=name)
    a0.set_xlabel("routing iterations T at test time")
    a0.set_ylabel("accuracy (%)")
    a1.set_xlabel("routing iterations T at test time")
    a1.set_ylabel("ms per image (forward)")
    for ax in (a0, a1):
        ax.set_xticks(sorted({r["iterations"] for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return finish_figure(fig, title)
