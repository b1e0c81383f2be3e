"""Figures of Heinsen's routing (2019, 2022): class-capsule pose trajectories as the viewpoint moves, which
part capsules each class capsule explains (maps over the grid, per iteration), which tokens each output
capsule credits in a sequence, and how the routings' memory and time grow with the numbers of capsules.
Static twins of :func:`~capsule_lib.viz.explorers.pose_trajectory_explorer` and
:func:`~capsule_lib.viz.explorers.class_credit_explorer`. The poses, their projections and the credit maps are
computed by :mod:`capsule_lib.analysis` (:func:`~capsule_lib.analysis.class_poses`,
:func:`~capsule_lib.analysis.pose_projection`, :func:`~capsule_lib.analysis.class_credit_maps`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .._contracts import checked
from ..analysis import pose_projection
from .data import to_display
from .plots import finish_figure

__all__ = [
    "plot_pose_trajectories",
    "plot_viewpoint_state",
    "plot_class_credits",
    "credit_readout",
    "plot_token_credits",
    "plot_routing_scaling",
]


@checked
def plot_pose_trajectories(
    poses: torch.Tensor,
    steps: Sequence[float],
    panel_names: Sequence[str],
    line_names: Sequence[str],
    step_label: str = "azimuth (degrees)",
    title: str = "",
    cyclic: bool = True,
) -> Figure:
    """Pose trajectories, one panel per class capsule: ``poses [P, L, S, D]`` = for panel ``p``, line ``l``
    (e.g. an object instance) and step ``s`` of a viewpoint sweep (``steps``, e.g. azimuths), the pose of
    that panel's class capsule. Each panel is that capsule's own 2-D PCA; points are coloured by the step
    (a cyclic colour map for ``cyclic`` sweeps such as azimuth), the first step is circled. The panels fill rows
    of at most three (five classes: 3 + 2)."""
    P, L, S, _ = poses.shape
    ncols, nrows = min(P, 3), -(-P // 3)
    fig, grid = plt.subplots(
        nrows, ncols, figsize=(2.9 * ncols + 0.5, 2.9 * nrows + 0.4), squeeze=False, layout="constrained"
    )
    for ax in grid.flat[P:]:
        ax.remove()  # the empty cells of the last row
    axes = grid.flat[:P]
    cmap = plt.get_cmap("twilight" if cyclic else "viridis")
    norm = plt.Normalize(min(steps), max(steps) + (steps[1] - steps[0] if cyclic and S > 1 else 0))
    markers = "osD^vP*X"
    for p, ax in enumerate(axes):
        proj = pose_projection(poses[p].reshape(L * S, -1))
        xy = proj.apply(poses[p]).numpy()  # [L, S, 2]
        for line in range(L):
            pts = xy[line]
            path = np.concatenate([pts, pts[:1]]) if cyclic else pts
            ax.plot(path[:, 0], path[:, 1], color="0.6", lw=0.8, zorder=1)
            ax.scatter(
                pts[:, 0],
                pts[:, 1],
                c=[cmap(norm(v)) for v in steps],
                s=22,
                marker=markers[line % 8],
                edgecolors="k",
                linewidths=0.3,
                zorder=2,
                label=line_names[line],
            )
            ax.scatter(pts[:1, 0], pts[:1, 1], s=90, facecolors="none", edgecolors="k", linewidths=1.0, zorder=3)
        ax.set_title(f"class capsule '{panel_names[p]}'", fontsize=9)
        ax.set_xlabel(f"PC 1 ({100 * float(proj.explained[0]):.0f}%)", fontsize=8)
        ax.set_ylabel(f"PC 2 ({100 * float(proj.explained[1]):.0f}%)", fontsize=8)
        ax.tick_params(labelsize=8)
        if L > 1:
            ax.legend(fontsize=8, loc="best")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=norm)
    cbar = fig.colorbar(sm, ax=list(axes), fraction=0.02, pad=0.01)
    cbar.set_label(step_label, fontsize=8)
    cbar.ax.tick_params(labelsize=8)
    return finish_figure(fig, title, layout=False)


@checked
def plot_viewpoint_state(
    image: torch.Tensor,
    probs: torch.Tensor,
    track: torch.Tensor,
    current: int,
    classes: Sequence[str],
    capsule: int,
    reference: torch.Tensor | None = None,
    title: str = "",
) -> Figure:
    """One view of an object (the twin of the pose explorer): the stereo image, the class probabilities
    ``probs [K]`` (prediction in orange) and the projected pose trajectory ``track [S, 2]`` of class capsule
    ``capsule`` with the current step ``current`` starred (``reference [S, 2]``: another sweep, in grey)."""
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.1), gridspec_kw={"width_ratios": [1.3, 1.2, 1.3]})
    axes[0].imshow(to_display(image), cmap="gray")
    axes[0].set_xticks([])
    axes[0].set_yticks([])
    axes[0].set_title(title or "input (left | right camera)", fontsize=10)
    pred = int(probs.argmax())
    axes[1].bar(
        range(len(classes)),
        probs.numpy(),
        color=["tab:orange" if k == pred else "tab:blue" for k in range(len(classes))],
    )
    axes[1].set_xticks(range(len(classes)), classes, fontsize=10, rotation=20, ha="right")
    axes[1].set_ylim(0, 1)
    axes[1].set_title(f"class probabilities: {classes[pred]} ({float(probs[pred]):.2f})", fontsize=10)
    ax = axes[2]
    if reference is not None:
        ref = reference.numpy()
        ax.plot(ref[:, 0], ref[:, 1], color="0.75", lw=1, marker=".", label="reference sweep")
    tr = track.numpy()
    ax.plot(tr[:, 0], tr[:, 1], color="tab:blue", lw=1, marker="o", ms=3, label="this sweep")
    ax.scatter(tr[current, 0], tr[current, 1], s=160, marker="*", color="tab:orange", zorder=3, label="this view")
    ax.set_title(f"pose of class capsule '{classes[capsule]}' (PCA)", fontsize=10)
    for a in axes[1:]:
        a.tick_params(labelsize=10)
    ax.legend(fontsize=10, loc="best", handlelength=1.2, borderaxespad=0.2)
    fig.tight_layout()
    return fig


@checked
def plot_class_credits(
    image: torch.Tensor,
    maps: torch.Tensor,
    classes: Sequence[str],
    label: int | None = None,
    iterations: Sequence[int] | None = None,
    title: str = "",
) -> Figure:
    """Which part capsules each class capsule explains: ``maps [T, K, h, w]`` (rows: iterations of the class
    routing; columns: class capsules) of :func:`~capsule_lib.analysis.credit_maps` (one image's entry of
    :func:`~capsule_lib.analysis.class_credit_maps`), drawn over the left camera image (each grid cell where the
    part capsules of that position sit). A column's title gives the class capsule's share of all the credit in
    the last row."""
    T, K = maps.shape[:2]
    its = list(iterations) if iterations is not None else list(range(1, T + 1))
    left = to_display(image[:1] if image.dim() == 3 else image)  # the left camera
    H, Wd = left.shape[:2]
    vmax = float(maps.max()) or 1.0
    share = maps[-1].sum((-1, -2)) / maps[-1].sum().clamp_min(1e-12)
    fig, axes = plt.subplots(T, K + 1, figsize=(1.35 * (K + 1) + 0.4, 1.45 * T + 0.5), squeeze=False)
    for t in range(T):
        axes[t, 0].imshow(left, cmap="gray")
        axes[t, 0].set_ylabel(f"iteration {its[t]}", fontsize=8)
        if t == 0:
            axes[t, 0].set_title("left image" + (f" ({classes[label]})" if label is not None else ""), fontsize=8)
        for k in range(K):
            ax = axes[t, k + 1]
            ax.imshow(left, cmap="gray")
            im = ax.imshow(
                maps[t, k].numpy(),
                cmap="magma",
                alpha=0.65,
                vmin=0,
                vmax=vmax,
                extent=(-0.5, Wd - 0.5, H - 0.5, -0.5),
                interpolation="nearest",
            )
            if t == 0:
                ax.set_title(f"{classes[k]} ({100 * float(share[k]):.0f}%)", fontsize=8)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01).set_label("credit", fontsize=8)
    return finish_figure(fig, title, layout=False)


def credit_readout(maps: torch.Tensor, probs: torch.Tensor, classes: Sequence[str]) -> str:
    """One line: the prediction and each class capsule's share of the credit (``maps [K, h, w]``)."""
    share = maps.sum((-1, -2)) / maps.sum().clamp_min(1e-12)
    pred = int(probs.argmax())
    parts = " ".join(f"{c}:{100 * float(s):.0f}%" for c, s in zip(classes, share))
    return f"predicts {classes[pred]} (p={float(probs[pred]):.2f}); share of credit {parts}"


@checked
def plot_token_credits(
    tokens: torch.Tensor,
    credits: torch.Tensor,
    classes: Sequence[str],
    labels: torch.Tensor,
    preds: torch.Tensor,
    n_markers: int,
    label: str = "credit (chained phi)",
) -> Figure:
    """Which tokens each output capsule credits, for a few sequences: ``tokens [S, n]`` (0 = padding),
    ``credits [S, n, K]`` (:meth:`~capsule_lib.models.TokenSequenceClassifier.token_credits`). One heat map
    per sequence (rows: output capsules; columns: its tokens, padding cut; red for, blue against), marker
    tokens named by letter, filler tokens shown as a dot. ``label`` names the colour bar (e.g. an occlusion
    effect from :meth:`~capsule_lib.models.TokenSequenceClassifier.token_occlusion` instead)."""
    S = tokens.shape[0]
    n_tok = (tokens != 0).sum(1)
    width = min(max(6.0, 0.2 * int(n_tok.max())), 8.0)  # at most 8 in: text stays >= 8 px in the book's column
    fig, axes = plt.subplots(S, 1, figsize=(width, 1.5 * S + 0.4), squeeze=False, layout="constrained")
    vmax = float(credits.abs().max()) or 1.0
    for s in range(S):
        n = int(n_tok[s])
        ax = axes[s, 0]
        im = ax.imshow(
            credits[s, :n].T.float().numpy(),
            cmap="RdBu_r",
            vmin=-vmax,
            vmax=vmax,
            aspect="auto",
            interpolation="nearest",
        )
        ticks = [chr(ord("A") + int(t) - 1) if 1 <= int(t) <= n_markers else "·" for t in tokens[s, :n]]
        ax.set_xticks(range(n), ticks, fontsize=8)
        for lbl, t in zip(ax.get_xticklabels(), tokens[s, :n]):
            if 1 <= int(t) <= n_markers:
                lbl.set_fontweight("bold")
                lbl.set_color("tab:red")
        ax.set_yticks(range(len(classes)), classes, fontsize=8)
        ax.grid(False)
        ax.set_title(
            f"label {classes[int(labels[s])]}, predicted {classes[int(preds[s])]} ({n} tokens)", fontsize=8, loc="left"
        )
    fig.colorbar(im, ax=axes.ravel().tolist(), fraction=0.02, pad=0.01).set_label(label, fontsize=8)
    return fig


_KIND_NAMES = {"dynamic": "dynamic routing (2017)", "heinsen_2019": "Heinsen 2019", "heinsen_2022": "Heinsen 2022"}


@checked
def plot_routing_scaling(rows: Sequence[dict[str, Any]], title: str = "") -> Figure:
    """Log-log plots of :func:`~capsule_lib.cost.routing_scaling` rows: activation memory (top) and forward +
    backward time (bottom, if measured) against ``n_inp`` (left; rows with the most common ``n_out``) and
    ``n_out`` (right; the most common ``n_inp``), one line per algorithm with its fitted slope."""
    from ..cost import loglog_slope

    def common(key: str) -> int:
        vals = [r[key] for r in rows]
        return max(set(vals), key=vals.count)

    timed = all(r["ms"] is not None for r in rows)
    fig, axes = plt.subplots(2 if timed else 1, 2, figsize=(8.4, 6.2 if timed else 3.3), squeeze=False)
    j_fix, i_fix = common("n_out"), common("n_inp")
    for col, (xkey, fixed_key, fixed) in enumerate([("n_inp", "n_out", j_fix), ("n_out", "n_inp", i_fix)]):
        for row, (ykey, ylabel) in enumerate(
            [("saved_mib", "memory kept for backward (MiB)"), ("ms", "forward + backward (ms)")][: 2 if timed else 1]
        ):
            ax = axes[row, col]
            for kind in dict.fromkeys(r["kind"] for r in rows):
                pts = sorted((r[xkey], r[ykey]) for r in rows if r["kind"] == kind and r[fixed_key] == fixed)
                if len(pts) < 2:
                    continue
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=f"{_KIND_NAMES.get(kind, kind)} (slope {loglog_slope(xs, ys):.2f})")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel(f"{xkey} ({fixed_key} = {fixed})", fontsize=9)
            ax.set_ylabel(ylabel, fontsize=9)
            ax.tick_params(labelsize=8)
            if ax.get_lines():
                ax.legend(fontsize=8)
    return finish_figure(fig, title)
