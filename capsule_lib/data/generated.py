"""Generated, deterministic stand-in datasets (no download needed).

``glyph_digits``: hand-drawn-like digits 0-9 rendered from stroke skeletons with random affine transforms,
stroke jitter and width, 28x28 grey, MNIST-like statistics. Small capsule nets learn it to > 95 % in about
a minute on a CPU, which makes it the data of smoke runs and tests. It is NOT MNIST: every page that uses
it says so.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from .datasets import ImageDataset, _check_split, register_dataset

__all__ = ["glyph_digits", "digit_skeletons", "rasterize_polylines", "colour_shapes", "COLOUR_SHAPE_CLASSES"]


def _arc(cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 10) -> list[tuple[float, float]]:
    """Points on an ellipse arc; angles in degrees, 0 = right, 90 = down (image coordinates)."""
    return [(cx + rx * math.cos(math.radians(a)), cy + ry * math.sin(math.radians(a)))
            for a in torch.linspace(a0, a1, n).tolist()]


def digit_skeletons() -> list[list[list[tuple[float, float]]]]:
    """For each digit 0-9, a list of polylines in the unit square (x right, y down)."""
    return [
        [_arc(0.5, 0.5, 0.2, 0.32, 0, 360, 20)],
        [[(0.38, 0.27), (0.52, 0.15), (0.52, 0.85)]],
        [_arc(0.5, 0.33, 0.2, 0.18, 200, 370, 10) + [(0.6, 0.55), (0.3, 0.85), (0.74, 0.85)]],
        [_arc(0.48, 0.32, 0.2, 0.17, 210, 450, 12), _arc(0.48, 0.66, 0.22, 0.19, 270, 500, 12)],
        [[(0.64, 0.85), (0.64, 0.15), (0.27, 0.62), (0.77, 0.62)]],
        [[(0.72, 0.15), (0.37, 0.15), (0.33, 0.46)] + _arc(0.47, 0.64, 0.22, 0.2, 240, 500, 12)],
        [[(0.66, 0.16), (0.48, 0.28), (0.34, 0.5)] + _arc(0.5, 0.65, 0.18, 0.19, 180, 540, 16)],
        [[(0.27, 0.16), (0.73, 0.16), (0.44, 0.85)]],
        [_arc(0.5, 0.31, 0.16, 0.16, 0, 360, 14), _arc(0.5, 0.66, 0.2, 0.19, 0, 360, 16)],
        [_arc(0.5, 0.35, 0.18, 0.18, 0, 360, 16), [(0.68, 0.36), (0.62, 0.6), (0.54, 0.86)]],
    ]


def _segments(polylines: list[list[tuple[float, float]]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten polylines into points ``[P, 2]`` and segment index pairs ``[S, 2]``."""
    pts, segs = [], []
    for line in polylines:
        base = len(pts)
        pts.extend(line)
        segs.extend((base + k, base + k + 1) for k in range(len(line) - 1))
    return torch.tensor(pts, dtype=torch.float32), torch.tensor(segs, dtype=torch.long)


def rasterize_polylines(points: torch.Tensor, segs: torch.Tensor, width: torch.Tensor, size: int = 28) -> torch.Tensor:
    """Anti-aliased strokes: ``points [N, P, 2]`` in unit coords, ``segs [S, 2]``, ``width [N]`` (unit
    half-width) -> ``[N, size, size]`` float in [0, 1]. Vectorised over samples, segments and pixels."""
    c = (torch.arange(size, dtype=torch.float32) + 0.5) / size
    yy, xx = torch.meshgrid(c, c, indexing="ij")
    pix = torch.stack([xx.flatten(), yy.flatten()], dim=-1)  # [Q, 2]
    a = points[:, segs[:, 0]]  # [N, S, 2]
    b = points[:, segs[:, 1]]  # [N, S, 2]
    ab = b - a  # [N, S, 2]
    ap = pix[None, None] - a[:, :, None]  # [N, S, Q, 2]
    t = (ap * ab[:, :, None]).sum(-1) / (ab.pow(2).sum(-1)[:, :, None] + 1e-9)  # [N, S, Q]
    t = t.clamp(0, 1)
    closest = a[:, :, None] + t[..., None] * ab[:, :, None]  # [N, S, Q, 2]
    d = (pix[None, None] - closest).norm(dim=-1).amin(dim=1)  # [N, Q]
    img = ((width[:, None] - d) * size + 0.5).clamp(0, 1)  # one-pixel anti-aliasing ramp
    return img.view(-1, size, size)


_CACHE: dict[tuple[int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def glyph_digits(n: int = 10000, seed: int = 0, size: int = 28, chunk: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` generated digits (balanced classes, shuffled): ``uint8 [n, 1, size, size]``, ``int64 [n]``.

    Deterministic in ``(n, seed, size)``; results are memoised (returned as fresh clones)."""
    key = (n, seed, size)
    if key not in _CACHE:
        _CACHE[key] = _glyph_digits(n, seed, size, chunk)
    x, y = _CACHE[key]
    return x.clone(), y.clone()


def _glyph_digits(n: int, seed: int, size: int, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    skel = [_segments(s) for s in digit_skeletons()]
    labels = torch.arange(n) % 10
    labels = labels[torch.randperm(n, generator=g)]
    images = torch.empty(n, 1, size, size, dtype=torch.uint8)
    for digit, (pts, segs) in enumerate(skel):
        idx = (labels == digit).nonzero().flatten()
        for lo in range(0, idx.numel(), chunk):
            sel = idx[lo:lo + chunk]
            m = sel.numel()
            rot = (torch.rand(m, generator=g) - 0.5) * math.radians(30)
            shear = (torch.rand(m, generator=g) - 0.5) * 0.5
            sx = 0.8 + 0.35 * torch.rand(m, generator=g)
            sy = 0.85 + 0.25 * torch.rand(m, generator=g)
            shift = (torch.rand(m, 2, generator=g) - 0.5) * 0.14
            cos, sin = torch.cos(rot), torch.sin(rot)
            A = torch.stack([torch.stack([cos * sx, (-sin + shear * cos) * sy], -1),
                             torch.stack([sin * sx, (cos + shear * sin) * sy], -1)], 1)  # [m, 2, 2]
            p = pts[None] + torch.randn(m, *pts.shape, generator=g) * 0.012  # jitter [m, P, 2]
            p = torch.einsum("mij,mpj->mpi", A, p - 0.5) + 0.5 + shift[:, None]
            width = 0.035 + 0.04 * torch.rand(m, generator=g)
            img = rasterize_polylines(p, segs, width, size)
            images[sel, 0] = (img * 255).round().to(torch.uint8)
    return images, labels


#: images per split of a generated dataset, and the seed offset of each split (``train_full`` = train + val)
_SPLIT_SIZES = {"train": 10000, "val": 2000, "test": 2000}
_SPLIT_SEEDS = {"train": 0, "val": 1, "test": 2}


def _generated_split(name: str, split: str, n: int | None, seed: int, make: Any, classes: list[str],
                     description: str) -> ImageDataset:
    """Split ``split`` of the generated dataset ``name`` drawn by ``make(count, seed=...)``: ``n`` images (the
    split's default size when ``None``) from the split's own seed; ``train_full`` is ``train`` + ``val``."""
    _check_split(split)
    if split == "train_full":
        half = None if n is None else n // 2
        a, b = (_generated_split(name, s, half, seed, make, classes, description) for s in ("train", "val"))
        return ImageDataset(name, split, torch.cat([a.images, b.images]), torch.cat([a.labels, b.labels]),
                            a.classes, True, a.description)
    x, y = make(n if n is not None else _SPLIT_SIZES[split], seed=1000 * seed + _SPLIT_SEEDS[split])
    return ImageDataset(name, split, x, y, list(classes), generated=True, description=description)


@register_dataset("glyph_digits")
def _load_glyph_digits(root: Path, split: str, download: bool, n: int | None = None, seed: int = 0,
                       **_: Any) -> ImageDataset:
    return _generated_split("glyph_digits", split, n, seed, glyph_digits, [str(i) for i in range(10)],
                            "synthetic digits rendered from stroke skeletons with random affine transforms (an "
                            "offline stand-in for MNIST, not MNIST).")


# ------------------------------------------------------------------------------ colour shapes (CIFAR stand-in)
#: the ten shape classes of :func:`colour_shapes`
COLOUR_SHAPE_CLASSES = ["disc", "square", "triangle", "ring", "cross", "bar", "corner", "ellipse", "pair", "half-disc"]


def colour_shapes(n: int = 10000, seed: int = 0, size: int = 32, chunk: int = 2000) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` RGB images ``uint8 [n, 3, size, size]`` of one of ten filled shapes (classes
    :data:`COLOUR_SHAPE_CLASSES`, balanced, in random order) with random colour, size (radius 5-11 px at 32 px),
    rotation and position (+-5 px), on a random two-colour gradient background with pixel noise; a seeded,
    deterministic offline stand-in for CIFAR-10 (same tensor format, not natural images)."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    labels = labels[torch.randperm(n, generator=g)]
    images = torch.empty(n, 3, size, size, dtype=torch.uint8)
    s = size / 32.0
    yy, xx = torch.meshgrid(torch.arange(size, dtype=torch.float32), torch.arange(size, dtype=torch.float32), indexing="ij")
    for lo in range(0, n, chunk):
        y = labels[lo : lo + chunk]
        m = y.shape[0]
        u = torch.rand(m, 12, generator=g)
        R = (5 + 6 * u[:, 0]) * s  # [m]
        cx = size / 2 - 0.5 + (u[:, 1] * 2 - 1) * 5 * s
        cy = size / 2 - 0.5 + (u[:, 2] * 2 - 1) * 5 * s
        th = u[:, 3] * 2 * math.pi
        dx, dy = xx[None] - cx[:, None, None], yy[None] - cy[:, None, None]  # [m, H, W]
        c, si = torch.cos(th)[:, None, None], torch.sin(th)[:, None, None]
        a, b = (c * dx + si * dy) / R[:, None, None], (-si * dx + c * dy) / R[:, None, None]  # shape coordinates
        r2 = a * a + b * b
        masks = torch.stack([
            r2 < 1,  # disc
            torch.maximum(a.abs(), b.abs()) < 0.8,  # square
            (b <= 0.5) & (a.abs() <= (b + 1) / math.sqrt(3)),  # triangle
            (r2 < 1) & (r2 > 0.55**2),  # ring
            ((a.abs() < 0.3) & (b.abs() < 1)) | ((b.abs() < 0.3) & (a.abs() < 1)),  # cross
            (a.abs() < 1) & (b.abs() < 0.3),  # bar
            ((a.abs() < 1) & (b > 0.45) & (b < 1)) | ((a > -1) & (a < -0.45) & (b.abs() < 1)),  # corner (L)
            a * a + (b / 0.5) ** 2 < 1,  # ellipse
            ((a - 0.55) ** 2 + b * b < 0.4**2) | ((a + 0.55) ** 2 + b * b < 0.4**2),  # pair of discs
            (r2 < 1) & (b > 0),  # half-disc
        ], 1)  # [m, 10, H, W]
        mask = masks[torch.arange(m), y].float()[:, None]  # [m, 1, H, W]
        fg = torch.rand(m, 3, generator=g)
        bg0, bg1 = torch.rand(m, 3, generator=g), torch.rand(m, 3, generator=g)
        close = (fg - 0.5 * (bg0 + bg1)).abs().mean(1) < 0.25  # keep the shape visible: push its colour away
        fg[close] = 1 - fg[close]
        ramp = ((torch.cos(u[:, 4] * 2 * math.pi)[:, None, None] * xx + torch.sin(u[:, 4] * 2 * math.pi)[:, None, None] * yy) / size + 1) / 2
        bg = bg0[:, :, None, None] * (1 - ramp[:, None]) + bg1[:, :, None, None] * ramp[:, None]  # [m, 3, H, W]
        img = bg * (1 - mask) + fg[:, :, None, None] * mask + 0.04 * torch.randn(m, 3, size, size, generator=g)
        images[lo : lo + chunk] = (img.clamp(0, 1) * 255).round().to(torch.uint8)
    return images, labels


@register_dataset("colour_shapes")
def _load_colour_shapes(root: Path, split: str, download: bool, n: int | None = None, seed: int = 0,
                        **_: Any) -> ImageDataset:
    return _generated_split("colour_shapes", split, n, seed, colour_shapes, COLOUR_SHAPE_CLASSES,
                            "synthetic RGB shapes (10 classes) with random colours, sizes, rotations and "
                            "backgrounds (an offline stand-in for CIFAR-10, not natural images).")
