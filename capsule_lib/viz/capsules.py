"""Static figures of capsule classifiers: routing maps, reconstructions, capsule-dimension perturbations,
MultiMNIST segmentation. Each function draws one figure from given tensors and returns it; the widgets in
:mod:`capsule_lib.viz.explorers` only wire sliders to these functions (their static twins).
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from .._contracts import checked
from ..analysis import decode_poses
from ..functional import capsule_lengths
from ..types import RoutingTrace
from .data import to_display

__all__ = [
    "coupling_grid",
    "routing_contributions",
    "coupling_entropy",
    "plot_routing_step",
    "plot_routing_iterations",
    "plot_coupling_sharpening",
    "plot_reconstructions",
    "perturb_poses",
    "plot_perturbation",
    "plot_perturbation_grid",
    "plot_lengths",
    "plot_segmentation",
    "plot_image_grid",
    "plot_self_attention",
]


def coupling_grid(
    trace: RoutingTrace, sample: int, parent: int, grid: tuple[int, int, int] = (32, 6, 6)
) -> torch.Tensor:
    """Coupling coefficients ``c_{i, parent}`` of one sample for every iteration, on the primary capsule
    grid: ``[T, n_types, h, w]`` (capsules are type-major, ``i = c*h*w + y*w + x``)."""
    c = trace.stacked("coefficients")[:, sample, :, parent]  # [T, I]
    return c.reshape(c.shape[0], *grid).float()


def routing_contributions(
    trace: RoutingTrace,
    sample: int,
    parent: int,
    grid: tuple[int, int, int] = (32, 6, 6),
) -> torch.Tensor:
    """How much each primary capsule sends to ``parent``: ``c_{i,parent} * |u_hat_{parent|i}|`` per
    iteration, ``[T, n_types, h, w]`` (needs the votes in ``trace.extra``)."""
    votes = trace.extra["votes"][sample, :, parent]  # [I, E]
    norm = votes.float().norm(dim=-1)  # [I]
    c = trace.stacked("coefficients")[:, sample, :, parent].float()  # [T, I]
    return (c * norm).reshape(c.shape[0], *grid)


@checked
def coupling_entropy(trace: RoutingTrace, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy (nats) of each child's coupling distribution over parents, per iteration: ``[T]``.

    ``weights [B, I]`` (e.g. primary capsule lengths) weight the mean toward active children."""
    c = trace.stacked("coefficients").float().clamp_min(1e-12)  # [T, B, I, J]
    h = -(c * c.log()).sum(-1)  # [T, B, I]
    if weights is None:
        return h.mean(dim=(1, 2))
    w = weights.float() / weights.float().sum()
    return (h * w).sum(dim=(1, 2))


def _mosaic(maps: torch.Tensor, cols: int = 8) -> np.ndarray:
    """``[N, h, w]`` -> one image with N tiles (1-pixel NaN gutters)."""
    n, h, w = maps.shape
    rows = int(np.ceil(n / cols))
    out = np.full((rows * (h + 1) - 1, cols * (w + 1) - 1), np.nan)
    for k in range(n):
        r, c = divmod(k, cols)
        out[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = maps[k].numpy()
    return out


def plot_routing_step(
    image: torch.Tensor,
    trace: RoutingTrace,
    sample: int,
    iteration: int,
    parent: int | None = None,
    grid: tuple[int, int, int] = (32, 6, 6),
    classes: Sequence[str] | None = None,
) -> Figure:
    """One routing iteration for one image: the input, the coupling of every primary capsule to ``parent``
    (default: the final winner) as a mosaic of the capsule types, what each sends (coupling x vote length)
    summed over types on the spatial grid, and the output capsule lengths after this iteration."""
    outs = trace.outputs[iteration][sample]
    final_len = capsule_lengths(trace.outputs[-1][sample].float())
    parent = int(final_len.argmax()) if parent is None else parent
    names = list(classes) if classes is not None else [str(k) for k in range(final_len.numel())]
    coup = coupling_grid(trace, sample, parent, grid)[iteration]  # [N, h, w]
    # two rows of two panels (input | mosaic, sent | lengths); every text >= 10 pt, so the figure stays readable
    # as a page-mode frame saved at 60 dpi (routing_page_explorer)
    fig = plt.figure(figsize=(8.0, 5.4))
    gs = fig.add_gridspec(2, 2, width_ratios=[1, 2.2])
    axes = [fig.add_subplot(gs[r, c]) for r, c in ((0, 0), (0, 1), (1, 0), (1, 1))]
    axes[0].imshow(to_display(image), cmap="gray")
    axes[0].set_title("input")
    im = axes[1].imshow(_mosaic(coup), cmap="viridis", vmin=0, vmax=1)
    axes[1].set_title(f"iteration {iteration + 1}: c(i -> '{names[parent]}') per capsule type")
    fig.colorbar(im, ax=axes[1], fraction=0.025)
    if "votes" in trace.extra:
        contrib = routing_contributions(trace, sample, parent, grid)[iteration].sum(0)  # [h, w]
        axes[2].imshow(contrib.numpy(), cmap="magma")
        axes[2].set_title("sent to it (sum over types)")
    else:
        axes[2].imshow(coup.mean(0).numpy(), cmap="magma")
        axes[2].set_title("mean coupling")
    lengths = capsule_lengths(outs.float()).numpy()
    colors = ["tab:orange" if k == parent else "tab:blue" for k in range(len(lengths))]
    axes[3].bar(range(len(lengths)), lengths, color=colors)
    axes[3].set_xticks(range(len(lengths)), names)
    axes[3].set_ylim(0, 1)
    axes[3].set_title("output capsule lengths")
    axes[3].tick_params(labelsize=10)
    for a in axes[:3]:
        a.set_xticks([])
        a.set_yticks([])
    fig.tight_layout()
    return fig


@checked
def plot_routing_iterations(
    image: torch.Tensor,
    trace: RoutingTrace,
    sample: int,
    parent: int | None = None,
    grid: tuple[int, int, int] = (32, 6, 6),
    classes: Sequence[str] | None = None,
) -> Figure:
    """All iterations, one under the other (the static twin of the routing explorer): the input on top, above
    the spatial maps; then one row per iteration with the coupling mosaic toward the winning capsule, the spatial
    map of what is sent to it, and the output lengths (``fig.axes``: the input, then three panels and the
    mosaic's colour bar per row)."""
    T = trace.iterations
    final_len = capsule_lengths(trace.outputs[-1][sample].float())
    parent = int(final_len.argmax()) if parent is None else parent
    names = list(classes) if classes is not None else [str(k) for k in range(final_len.numel())]
    coup = coupling_grid(trace, sample, parent, grid)  # [T, N, h, w]
    contrib = routing_contributions(trace, sample, parent, grid).sum(1) if "votes" in trace.extra else coup.mean(1)
    fig = plt.figure(figsize=(8.6, 1.9 + 2.3 * T), layout="constrained")
    gs = fig.add_gridspec(T + 1, 3, width_ratios=[2.2, 1, 1.4], height_ratios=[0.8] + [1.0] * T)
    ax_in = fig.add_subplot(gs[0, 1])
    ax_in.imshow(to_display(image), cmap="gray")
    ax_in.set_title("input")
    ax_in.set_xticks([])
    ax_in.set_yticks([])
    vmax_contrib = float(contrib.max())
    for t in range(T):
        ax = [fig.add_subplot(gs[t + 1, c]) for c in range(3)]
        im = ax[0].imshow(_mosaic(coup[t]), cmap="viridis", vmin=0, vmax=1)
        ax[0].set_ylabel(f"iteration {t + 1}", fontsize=11)
        fig.colorbar(im, ax=ax[0], fraction=0.025)
        ax[1].imshow(contrib[t].numpy(), cmap="magma", vmin=0, vmax=vmax_contrib)
        lengths = capsule_lengths(trace.outputs[t][sample].float()).numpy()
        ax[2].bar(
            range(len(lengths)),
            lengths,
            color=["tab:orange" if k == parent else "tab:blue" for k in range(len(lengths))],
        )
        ax[2].set_xticks(range(len(lengths)), names, fontsize=9)
        ax[2].set_ylim(0, 1)
        ax[2].tick_params(labelsize=9)
        for a in ax[:2]:
            a.set_xticks([])
            a.set_yticks([])
        if t == 0:
            ax[0].set_title(f"coupling to '{names[parent]}' ({grid[0]} capsule types, each {grid[1]}x{grid[2]})")
            ax[1].set_title("sent to it:\nsum of c*|u_hat|")
            ax[2].set_title("output lengths")
    return fig


@checked
def plot_coupling_sharpening(
    trace: RoutingTrace, primary_lengths: torch.Tensor | None = None, parent_of: torch.Tensor | None = None
) -> Figure:
    """How routing sharpens over iterations, over a batch: (left) mean entropy of the children's coupling
    distributions; (right) histogram of couplings to each image's winning capsule, per iteration."""
    T = trace.iterations
    ent = coupling_entropy(trace, primary_lengths).numpy()
    c = trace.stacked("coefficients").float()  # [T, B, I, J]
    if parent_of is None:
        parent_of = capsule_lengths(trace.outputs[-1].float()).argmax(-1)  # [B]
    idx = parent_of.view(1, -1, 1, 1).expand(T, -1, c.shape[2], 1)
    to_winner = c.gather(3, idx).squeeze(-1)  # [T, B, I]
    fig, axes = plt.subplots(1, 2, figsize=(9.0, 3.4))
    J = c.shape[-1]
    axes[0].plot(range(1, T + 1), ent, "o-")
    axes[0].axhline(np.log(J), ls="--", c="gray", lw=1)
    axes[0].text(1, np.log(J), f" uniform = ln {J}", va="bottom", fontsize=9, color="gray")
    axes[0].set_xlabel("iteration")
    axes[0].set_ylabel("mean coupling entropy (nats)")
    axes[0].set_xticks(range(1, T + 1))
    bins = np.linspace(0, 1, 41)
    for t in range(T):
        axes[1].hist(to_winner[t].flatten().numpy(), bins=bins, histtype="step", lw=1.5, label=f"iteration {t + 1}")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("coupling c(i -> winning capsule)")
    axes[1].set_ylabel("number of (image, capsule) pairs")
    axes[1].legend()
    fig.tight_layout()
    return fig


@checked
def plot_reconstructions(
    images: torch.Tensor,
    recons: torch.Tensor,
    labels: Sequence[int] | torch.Tensor | None = None,
    preds: Sequence[int] | torch.Tensor | None = None,
    n: int = 10,
) -> Figure:
    """Inputs (top row) vs reconstructions (bottom row)."""
    n = min(n, images.shape[0])
    parts = [
        (f"y={int(labels[k])}" if labels is not None else "", f"p={int(preds[k])}" if preds is not None else "")
        for k in range(n)
    ]
    titles = [" ".join(p for p in pair if p) for pair in parts]
    bottoms = [to_display(recons[k]) for k in range(n)]
    return _inputs_above(images, bottoms, titles, "recon.", (max(0.9 * n, 3.0), 2.5))  # 10 images: 9 in


def _inputs_above(
    images: torch.Tensor, bottoms: Sequence[np.ndarray], titles: Sequence[str], bottom_label: str, figsize: tuple
) -> Figure:
    """Two rows: the titled input images above ``bottoms`` (display-ready grey or RGB arrays, one per input)."""
    n = len(bottoms)
    fig, axes = plt.subplots(2, n, figsize=figsize, squeeze=False)
    for k in range(n):
        axes[0, k].imshow(to_display(images[k]), cmap="gray")
        axes[1, k].imshow(bottoms[k], cmap="gray" if bottoms[k].ndim == 2 else None)
        axes[0, k].set_title(titles[k], fontsize=8)
        for a in axes[:, k]:
            a.set_xticks([])
            a.set_yticks([])
    axes[0, 0].set_ylabel("input")
    axes[1, 0].set_ylabel(bottom_label)
    fig.tight_layout()
    return fig


def perturb_poses(
    poses: torch.Tensor, offsets: torch.Tensor | Sequence[float], label: int | None = None
) -> torch.Tensor:
    """Add ``offsets [D]`` to the pose dimensions: of every capsule (``label=None``, as the
    Efficient-CapsNet notebook does) or of the ``label`` capsule only (Sabour et al., Fig. 4).
    ``poses [K, D]`` or ``[B, K, D]``."""
    off = torch.as_tensor(offsets, dtype=poses.dtype, device=poses.device)
    if label is None:
        return poses + off
    out = poses.clone()
    out[..., label, :] = out[..., label, :] + off
    return out


def plot_lengths(ax, lengths: np.ndarray, highlight: int | None = None, classes: Sequence[str] | None = None) -> None:
    names = list(classes) if classes is not None else [str(k) for k in range(len(lengths))]
    ax.bar(
        range(len(lengths)),
        lengths,
        color=["tab:orange" if k == highlight else "tab:blue" for k in range(len(lengths))],
    )
    ax.set_xticks(range(len(lengths)), names, fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_title("capsule lengths")


@checked
def plot_perturbation(
    model: torch.nn.Module,
    image: torch.Tensor,
    poses: torch.Tensor,
    label: int,
    offsets: Sequence[float],
    perturb: str = "all",
    classes: Sequence[str] | None = None,
) -> Figure:
    """Input, reconstruction from the perturbed ``label`` capsule, and the lengths of the perturbed capsules.

    ``poses [K, D]`` of one image; ``offsets [D]``; ``perturb``: ``"all"`` capsules or only the ``"label"``. The
    ``model`` is only passed to :func:`~capsule_lib.analysis.decode_poses`, which decodes the perturbed poses."""
    p = perturb_poses(poses, offsets, None if perturb == "all" else label)
    recon = decode_poses(model, p[None], label)[0]
    fig, axes = plt.subplots(1, 3, figsize=(9, 2.9), gridspec_kw={"width_ratios": [1, 1, 1.6]})
    axes[0].imshow(to_display(image), cmap="gray")
    axes[0].set_title("input")
    axes[1].imshow(to_display(recon), cmap="gray")
    axes[1].set_title("reconstruction")
    for a in axes[:2]:
        a.set_xticks([])
        a.set_yticks([])
    plot_lengths(axes[2], capsule_lengths(p.float()).cpu().numpy(), label, classes)
    fig.tight_layout()
    return fig


@checked
def plot_perturbation_grid(
    model: torch.nn.Module,
    poses: torch.Tensor,
    label: int,
    values: Sequence[float] = tuple(np.round(np.arange(-0.25, 0.2501, 0.05), 2)),
    dims: Sequence[int] | None = None,
    image: torch.Tensor | None = None,
) -> Figure:
    """The paper's Figure 4: one row per pose dimension, one column per perturbation value; each cell is
    the reconstruction after adding that value to that dimension of the ``label`` capsule. With ``image``,
    a first row shows the input next to the unperturbed reconstruction. The ``model`` is only passed to
    :func:`~capsule_lib.analysis.decode_poses`, which decodes every cell in one batch."""
    D = poses.shape[-1]
    dims = list(range(D)) if dims is None else list(dims)
    vals = torch.tensor([float(v) + 0.0 for v in values], dtype=poses.dtype)  # + 0.0 turns -0.0 into 0.0
    batch = poses[None].repeat(len(dims) * len(vals) + 1, 1, 1)  # [R*V + 1, K, D]; the last is unperturbed
    for r, d in enumerate(dims):
        batch[r * len(vals) : (r + 1) * len(vals), label, d] += vals.to(poses.device)
    recons = decode_poses(model, batch, label).cpu()  # [R*V + 1, C, H, W]
    top = 1 if image is not None else 0
    nrows, ncols = len(dims) + top, len(vals) + 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(0.75 * ncols, 0.78 * nrows), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
        ax.axis("off")
    if top:
        for col, (img, title) in enumerate(((image, "input"), (recons[-1], "recon."))):
            ax = axes[0, 1 + col]
            ax.axis("on")
            ax.imshow(to_display(img), cmap="gray", vmin=0, vmax=1)
            ax.set_title(title, fontsize=8)
    for r, d in enumerate(dims):
        axes[top + r, 0].text(
            0.95, 0.5, f"dim {d}", ha="right", va="center", fontsize=8, transform=axes[top + r, 0].transAxes
        )
        for c in range(len(vals)):
            ax = axes[top + r, c + 1]
            ax.axis("on")
            ax.imshow(to_display(recons[r * len(vals) + c]), cmap="gray", vmin=0, vmax=1)
            if r == len(dims) - 1:
                ax.set_xlabel(f"{float(vals[c]):+.2f}", fontsize=8)
    fig.subplots_adjust(wspace=0.05, hspace=0.08)
    return fig


@checked
def plot_segmentation(
    images: torch.Tensor,
    recon_a: torch.Tensor,
    recon_b: torch.Tensor,
    labels: torch.Tensor | None = None,
    preds: torch.Tensor | None = None,
    n: int = 8,
) -> Figure:
    """MultiMNIST: input (top) and the two reconstructions overlaid in red and green (bottom)."""
    n = min(n, images.shape[0])
    bottoms, titles = [], []
    for k in range(n):
        rgb = np.zeros((*to_display(recon_a[k]).shape, 3))
        rgb[..., 0] = to_display(recon_a[k])
        rgb[..., 1] = to_display(recon_b[k])
        bottoms.append(rgb.clip(0, 1))
        lines = []
        if labels is not None:
            lines.append("y=" + ",".join(str(int(v)) for v in labels[k]))
        if preds is not None:
            lines.append("p=" + ",".join(str(int(v)) for v in preds[k]))
        titles.append("\n".join(lines))
    return _inputs_above(images, bottoms, titles, "red/green", (max(1.1 * n, 3.3), 2.9))  # 8 images: 8.8 in


@checked
def plot_image_grid(
    images: torch.Tensor, titles: Sequence[str] | None = None, cols: int = 10, size: float | None = None
) -> Figure:
    """A grid of images with optional titles; ``size``: inches per image (default: 1.2, less for more than
    seven columns, so that the grid is at most 8.4 in wide and its titles stay readable in the book's column)."""
    size = min(1.2, 8.4 / cols) if size is None else size
    n = images.shape[0]
    rows = max(1, int(np.ceil(n / cols)))
    fig, axes = plt.subplots(rows, cols, figsize=(size * cols, (size + 0.25) * rows), squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.set_xticks([])
        ax.set_yticks([])
        if k < n:
            ax.imshow(to_display(images[k]), cmap="gray")
            if titles is not None:
                ax.set_title(titles[k], fontsize=8)
        else:
            ax.axis("off")
    fig.tight_layout()
    return fig


@checked
def plot_self_attention(
    image: torch.Tensor,
    trace: RoutingTrace,
    sample: int,
    parent: int | None = None,
    classes: Sequence[str] | None = None,
) -> Figure:
    """Self-attention routing (Mazzia et al. 2021) for one image: the attention matrix ``A_j = U_j U_j^T``
    between the votes for class ``parent`` (default: the predicted class), the routing coefficients
    ``softmax_j(rowsum(A_j)/sqrt(D))`` of every primary capsule over the classes, the same after adding the
    learned log-prior bias, and the output lengths."""
    v = trace.outputs[-1][sample].float()
    lengths = capsule_lengths(v).numpy()
    parent = int(lengths.argmax()) if parent is None else parent
    names = list(classes) if classes is not None else [str(k) for k in range(len(lengths))]
    attn = trace.extra["attention"][sample, parent].float().numpy()  # [I, I]
    c = trace.coefficients[-1][sample].float().numpy()  # [I, J]
    cb = trace.extra["coefficients_with_prior"][sample].float().numpy()  # [I, J]
    # two rows (input | attention | lengths, then the two coupling maps): at most three panels side by side
    fig = plt.figure(figsize=(9.6, 6.6), layout="constrained")
    outer = fig.add_gridspec(2, 1)
    top, bottom = outer[0].subgridspec(1, 3, width_ratios=[0.8, 2.0, 1.4]), outer[1].subgridspec(1, 2)
    axes = [fig.add_subplot(top[0, 0]), fig.add_subplot(top[0, 1])]
    axes += [fig.add_subplot(bottom[0, 0]), fig.add_subplot(bottom[0, 1]), fig.add_subplot(top[0, 2])]
    axes[0].imshow(to_display(image), cmap="gray")
    axes[0].set_title("input")
    axes[0].set_xticks([])
    axes[0].set_yticks([])
    lim = float(np.abs(attn).max()) or 1.0
    im = axes[1].imshow(attn, cmap="RdBu_r", vmin=-lim, vmax=lim)
    axes[1].set_title(f"attention between votes for '{names[parent]}'", fontsize=10)
    axes[1].set_xlabel("primary capsule k")
    axes[1].set_ylabel("primary capsule i")
    fig.colorbar(im, ax=axes[1], fraction=0.046)
    for ax, mat, title in (
        (axes[2], c, "coupling c (softmax over classes)"),
        (axes[3], cb, "c + log-prior bias (used)"),
    ):
        im = ax.imshow(mat, cmap="viridis", aspect="auto")
        ax.set_title(title, fontsize=10)
        ax.set_xticks(range(len(names)), names, fontsize=9)
        ax.set_xlabel("class j")
        ax.set_ylabel("primary capsule i")
        fig.colorbar(im, ax=ax, fraction=0.046)
    plot_lengths(axes[4], lengths, parent, classes)
    axes[4].tick_params(labelsize=9)
    return fig
