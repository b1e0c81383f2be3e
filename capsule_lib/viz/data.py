"""Static figures of datasets: sample grids, MultiMNIST pairs and overlap, viewpoint/lighting sweeps.

Plain functions returning matplotlib figures (no widgets). Every figure of a generated set carries
"GENERATED" in its title so a reader cannot mistake it for the real dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .plots import finish_figure

__all__ = [
    "to_display",
    "image_grid",
    "show_samples",
    "show_multimnist",
    "plot_overlap",
    "show_viewpoints",
    "show_lightings",
    "show_stereo_pairs",
    "show_affine",
    "MAX_WIDTH",
]


#: the widest a grid of images gets (inches at 100 dpi), 900 px, shown at 688 px in the book's column, where the
#: grids' 8 pt titles are 8.5 px high (:mod:`capsule_lib.viz.readability`)
MAX_WIDTH = 9.0


def _plt():
    import matplotlib.pyplot as plt

    return plt


def to_display(x: torch.Tensor) -> np.ndarray:
    """One image ``[C, H, W]`` or ``[H, W]`` (uint8, or float in [0, 1]; clipped to it) -> an array for
    ``imshow``: grey ``[H, W]`` for one channel, the two stereo images side by side ``[H, 2W + 2]`` for two,
    ``[H, W, 3]`` RGB for three."""
    x = x.detach().cpu()
    x = (x.float() / 255.0 if x.dtype == torch.uint8 else x.float()).clamp(0, 1)
    if x.dim() == 2:
        return x.numpy()
    C = x.shape[0]
    if C == 1:
        return x[0].numpy()
    if C == 2:
        gap = torch.ones(x.shape[1], 2)
        return torch.cat([x[0], gap, x[1]], dim=1).numpy()
    if C >= 3:
        return x[:3].permute(1, 2, 0).numpy()
    raise ValueError(f"cannot display {C} channels")


def _title(ds: Any, text: str | None) -> str:
    base = text or f"{ds.name} / {ds.split}"
    return f"{base}  [GENERATED]" if getattr(ds, "generated", False) and "GENERATED" not in base else base


def image_grid(
    images: torch.Tensor,
    titles: Sequence[str] | None = None,
    ncols: int = 8,
    title: str | None = None,
    size: float = 1.3,
    fig=None,
):
    """Grid of ``[N, C, H, W]`` images (see :func:`to_display`) with optional per-image titles. ``size``: inches
    per image, less where the grid would be wider than :data:`MAX_WIDTH` (so its titles stay readable in the
    book's column)."""
    plt = _plt()
    n = images.shape[0]
    ncols = max(1, min(ncols, n))
    nrows = int(np.ceil(n / ncols))
    aspect = 2.0 if images.shape[1] == 2 else 1.0
    size = min(size, MAX_WIDTH / (ncols * aspect))
    extra = 0.3 if titles is not None else 0.0
    fig = fig or plt.figure(figsize=(ncols * size * aspect, nrows * (size + extra) + (0.4 if title else 0)))
    for i in range(n):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        ax.imshow(to_display(images[i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
        ax.set_axis_off()
        ax.grid(False)
        if titles is not None:
            ax.set_title(titles[i], fontsize=8)
    return finish_figure(fig, title)


def _label_text(ds: Any, i: int) -> str:
    y = ds.labels[i]
    if y.dim() == 0:
        return ds.classes[int(y)] if ds.classes else str(int(y))
    return "+".join(ds.classes[int(k)] for k in y.nonzero().flatten())


def show_samples(ds: Any, n: int = 16, ncols: int = 8, seed: int = 0, title: str | None = None, size: float = 1.3):
    """``n`` random samples of an :class:`~capsule_lib.data.ImageDataset` with their class names."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds), generator=g)[:n]
    return image_grid(ds.images[idx], [_label_text(ds, int(i)) for i in idx], ncols, _title(ds, title), size)


def show_multimnist(ds: Any, n: int = 8, seed: int = 0, title: str | None = None, size: float = 1.3):
    """MultiMNIST pairs: merged image (top row) and the two shifted source digits (rows 2 and 3)."""
    plt = _plt()
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds), generator=g)[:n]
    size = min(size, MAX_WIDTH / len(idx))
    fig, axes = plt.subplots(3, n, figsize=(n * size, 3 * size + 0.7), squeeze=False)
    rows = [("merged", ds.images), ("digit a", ds.extra["source_a"]), ("digit b", ds.extra["source_b"])]
    for r, (name, imgs) in enumerate(rows):
        for c, i in enumerate(idx.tolist()):
            ax = axes[r, c]
            ax.imshow(to_display(imgs[i]), cmap="gray", vmin=0, vmax=1, interpolation="nearest")
            ax.grid(False)
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"{int(ds.extra['label_a'][i])} + {int(ds.extra['label_b'][i])}", fontsize=8)
            elif r == 1:
                sa = ds.extra["shift_a"][i].tolist()
                ax.set_title(f"shift {sa}", fontsize=8)
            else:
                sb = ds.extra["shift_b"][i].tolist()
                ax.set_title(f"shift {sb}", fontsize=8)
            if c == 0:
                ax.set_ylabel(name, fontsize=8)
    fig.suptitle(_title(ds, title), fontsize=10)
    fig.tight_layout()
    return fig


def plot_overlap(datasets: dict[str, Any], bins: int = 30):
    """Histograms of the bounding-box overlap (IoU and intersection over the smaller box) of MultiMNIST
    sets, one colour per set (``{"Sabour +-4": ds, ...}``)."""
    from ..data.multimnist import bbox_overlap

    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    for name, ds in datasets.items():
        ov = bbox_overlap(ds.extra["source_a"], ds.extra["source_b"])
        for ax, key, label in zip(
            axes, ("iou", "inter_over_min"), ("IoU of the two boxes", "intersection / smaller box")
        ):
            v = ov[key].numpy()
            ax.hist(v, bins=bins, range=(0, 1), alpha=0.55, label=f"{name} (mean {v.mean():.2f})")
            ax.set_xlabel(label)
    axes[0].set_ylabel("pairs")
    axes[1].legend(fontsize=8)
    fig.suptitle("MultiMNIST bounding-box overlap [GENERATED]", fontsize=10)
    fig.tight_layout()
    return fig


def _find(ds: Any, **fields: int) -> int | None:
    m = torch.ones(len(ds), dtype=torch.bool)
    for k, v in fields.items():
        col = ds.labels if k == "category" else ds.extra[k]
        m &= col == v
    hits = m.nonzero().flatten()
    return int(hits[0]) if hits.numel() else None


def show_viewpoints(
    ds: Any,
    category: int = 0,
    instance: int | None = None,
    lighting: int = 0,
    camera: int = 0,
    elevations: Sequence[int] | None = None,
    azimuths: Sequence[int] | None = None,
    title: str | None = None,
    size: float = 0.75,
):
    """One object across viewpoints as one mosaic: rows = elevations, columns = azimuths (indices present in
    ``ds``), one camera of the stereo pair, one lighting; missing views are left blank. Works for smallNORB and
    the rendered set."""
    plt = _plt()
    if instance is None:
        instance = int(ds.extra["instance"][ds.labels == category][0])
    sel = (ds.labels == category) & (ds.extra["instance"] == instance) & (ds.extra["lighting"] == lighting)
    els = sorted(set(ds.extra["elevation"][sel].tolist())) if elevations is None else list(elevations)
    azs = sorted(set(ds.extra["azimuth"][sel].tolist())) if azimuths is None else list(azimuths)
    H, W = ds.images.shape[-2:]
    gap = max(1, H // 32)
    mosaic = np.ones((len(els) * (H + gap) - gap, len(azs) * (W + gap) - gap), dtype=np.float32)
    for r, e in enumerate(els):
        for c, a in enumerate(azs):
            i = _find(ds, category=category, instance=instance, lighting=lighting, elevation=e, azimuth=a)
            if i is not None:
                mosaic[r * (H + gap) : r * (H + gap) + H, c * (W + gap) : c * (W + gap) + W] = to_display(
                    ds.images[i][camera : camera + 1]
                )
    size = min(size, (MAX_WIDTH - 0.8) / len(azs))  # 18 azimuths: 0.45 in each
    fig, ax = plt.subplots(figsize=(len(azs) * size + 0.8, len(els) * size + 0.8))
    ax.imshow(mosaic, cmap="gray", vmin=0, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (W + gap) + W / 2 for c in range(len(azs))], [f"{20 * a}°" for a in azs], fontsize=8)
    ax.set_yticks([r * (H + gap) + H / 2 for r in range(len(els))], [f"{30 + 5 * e}°" for e in els], fontsize=8)
    ax.set_xlabel("azimuth", fontsize=9)
    ax.set_ylabel("elevation", fontsize=9)
    ax.tick_params(length=0)
    ax.grid(False)
    for sp in ax.spines.values():
        sp.set_visible(False)
    name = ds.classes[category] if ds.classes else str(category)
    ax.set_title(_title(ds, title or f"{name} #{instance} across viewpoints, lighting {lighting}"), fontsize=10)
    fig.tight_layout()
    return fig


def show_lightings(
    ds: Any,
    category: int = 0,
    instance: int | None = None,
    elevation: int = 0,
    azimuth: int = 0,
    title: str | None = None,
    size: float = 1.4,
):
    """One viewpoint of one object under each lighting condition present (stereo pairs)."""
    if instance is None:
        instance = int(ds.extra["instance"][ds.labels == category][0])
    idx = [
        i
        for l in range(6)
        if (i := _find(ds, category=category, instance=instance, elevation=elevation, azimuth=azimuth, lighting=l))
        is not None
    ]
    titles = [f"lighting {int(ds.extra['lighting'][i])}" for i in idx]
    name = ds.classes[category] if ds.classes else str(category)
    return image_grid(
        ds.images[idx],
        titles,
        ncols=len(idx),
        size=size,
        title=_title(
            ds,
            title
            or f"{name} #{instance}, elevation {30 + 5 * elevation}°, azimuth {20 * azimuth}°: the lighting conditions",
        ),
    )


def show_stereo_pairs(ds: Any, n: int = 10, seed: int = 0, ncols: int = 5, title: str | None = None, size: float = 1.4):
    """``n`` random stereo pairs (left | right) titled with their label fields."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds), generator=g)[:n].tolist()
    titles = []
    for i in idx:
        e, a, l = (int(ds.extra[k][i]) for k in ("elevation", "azimuth", "lighting"))
        titles.append(f"{_label_text(ds, i)} #{int(ds.extra['instance'][i])} el {30 + 5 * e}° az {20 * a}° L{l}")
    return image_grid(ds.images[idx], titles, ncols, _title(ds, title), size)


def show_affine(ds: Any, n: int = 16, ncols: int = 8, seed: int = 0, title: str | None = None, size: float = 1.3):
    """affine-MNIST samples titled with their label, rotation and scales."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randperm(len(ds), generator=g)[:n].tolist()
    e = ds.extra
    titles = [
        f"{_label_text(ds, i)}: {e['rotation'][i]:+.0f}° s{e['scale_x'][i]:.2f}/{e['scale_y'][i]:.2f}" for i in idx
    ]
    return image_grid(ds.images[idx], titles, ncols, _title(ds, title), size)
