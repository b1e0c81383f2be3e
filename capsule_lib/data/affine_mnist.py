"""affine-MNIST: MNIST test digits under random affine transforms in affNIST's ranges (GENERATED, seeded).

For robustness tests when the official affNIST file is not at hand (:mod:`capsule_lib.data.affnist`).
Each 28x28 digit is centred on a 40x40 canvas, transformed about the canvas centre by a random rotation,
shear and independent horizontal / vertical scaling (bilinear), then translated by a random integer offset
that keeps its bounding box inside the canvas ("significant translations", as in affNIST).

Default ranges: rotation ±20 degrees, shear ±0.1, scale 0.8-1.2 per axis: the values this library uses for
"affNIST ranges" (see :func:`capsule_lib.data.transforms.random_affine`). **[unverified]** They are meant
to match http://www.cs.toronto.edu/~tijmen/affNIST/, whose exact ranges could not be checked here; all
ranges are parameters. The translation rule (anywhere the box fits) is this library's choice.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from .datasets import ImageDataset, _check_split, register_dataset
from .multimnist import bounding_boxes, mnist_source
from .transforms import affine_images, shift_images

__all__ = ["make_affine_mnist", "AFFNIST_RANGES"]

AFFNIST_RANGES = {"rotation": 20.0, "shear": 0.1, "scale": (0.8, 1.2)}


def make_affine_mnist(images: torch.Tensor, seed: int = 0, size: int = 40, rotation: float = 20.0,
                      shear: float = 0.1, scale: tuple[float, float] = (0.8, 1.2), translate: bool = True,
                      chunk: int = 4096) -> dict[str, torch.Tensor]:
    """Transform uint8 ``[N, 1, h, w]`` digits: returns ``images`` uint8 ``[N, 1, size, size]`` and the
    parameters drawn per image: ``rotation`` (degrees), ``shear``, ``scale_x``, ``scale_y``, ``shift_x``,
    ``shift_y`` (pixels, after the linear part)."""
    N, C, h, w = images.shape
    g = torch.Generator().manual_seed(int(seed))
    u = torch.rand(N, 4, generator=g, dtype=torch.float64).float()
    rot = (u[:, 0] * 2 - 1) * rotation
    sh = (u[:, 1] * 2 - 1) * shear
    sx = scale[0] + (scale[1] - scale[0]) * u[:, 2]
    sy = scale[0] + (scale[1] - scale[0]) * torch.rand(N, generator=g, dtype=torch.float64).float()
    ut = torch.rand(N, 2, generator=g, dtype=torch.float64).float()
    out = torch.empty(N, C, size, size, dtype=torch.uint8)
    shift_x = torch.zeros(N, dtype=torch.long)
    shift_y = torch.zeros(N, dtype=torch.long)
    top, left = (size - h) // 2, (size - w) // 2
    for lo in range(0, N, chunk):
        sl = slice(lo, lo + chunk)
        x = torch.nn.functional.pad(images[sl].float() / 255.0, (left, size - w - left, top, size - h - top))
        th = torch.deg2rad(rot[sl])
        cos, sin = torch.cos(th), torch.sin(th)
        # forward map A = R(theta) @ [[1, shear], [0, 1]] @ diag(sx, sy) in normalised canvas coordinates
        a11, a12 = cos * sx[sl], (cos * sh[sl] - sin) * sy[sl]
        a21, a22 = sin * sx[sl], (sin * sh[sl] + cos) * sy[sl]
        A = torch.stack([torch.stack([a11, a12], -1), torch.stack([a21, a22], -1)], 1)  # [b, 2, 2]
        theta = torch.cat([torch.linalg.inv(A), torch.zeros(A.shape[0], 2, 1)], -1)  # output -> input
        y = (affine_images(x, theta).clamp(0, 1) * 255).round().to(torch.uint8)
        if translate:
            box = bounding_boxes(y)  # (top, bottom, left, right)
            empty = box[:, 1] < box[:, 0]
            lo_x, hi_x = -box[:, 2], size - 1 - box[:, 3]
            lo_y, hi_y = -box[:, 0], size - 1 - box[:, 1]
            dx = lo_x + (ut[sl, 0] * (hi_x - lo_x + 1).float()).long().clamp_max(hi_x - lo_x)
            dy = lo_y + (ut[sl, 1] * (hi_y - lo_y + 1).float()).long().clamp_max(hi_y - lo_y)
            dx, dy = torch.where(empty, 0, dx), torch.where(empty, 0, dy)
            y = shift_images(y, dx, dy)
            shift_x[sl], shift_y[sl] = dx, dy
        out[sl] = y
    return {"images": out, "rotation": rot, "shear": sh, "scale_x": sx, "scale_y": sy,
            "shift_x": shift_x, "shift_y": shift_y}


@register_dataset("affine_mnist")
def _load_affine_mnist(root: Path, split: str, download: bool, *, n: int | None = None, seed: int = 0,
                       source: str = "auto", size: int = 40, rotation: float = 20.0, shear: float = 0.1,
                       scale: tuple[float, float] = (0.8, 1.2), **_: Any) -> ImageDataset:
    """``get_dataset("affine_mnist", root, "test", n=None, seed=0, source="auto")``: GENERATED random
    affine transforms (affNIST ranges, see the module) of the MNIST ``split`` (the test set by intent),
    uint8 ``[N, 1, 40, 40]``; the drawn parameters are in ``extra``. Source digits as for MultiMNIST."""
    _check_split(split)
    src, kind = mnist_source(root, split, download, source, "affine_mnist", n_glyph=n)
    if n is not None:
        src = src.subset(n)
    d = make_affine_mnist(src.images, seed=1000 * seed + 17, size=size, rotation=rotation, shear=shear, scale=scale)
    what = "real MNIST" if kind == "mnist" else "the generated glyph_digits (NOT MNIST)"
    desc = (f"GENERATED affine-MNIST: {what} {split} digits on a {size}x{size} canvas with random rotation "
            f"±{rotation:g}°, shear ±{shear:g}, scale {scale[0]:g}-{scale[1]:g} per axis and a random "
            f"translation inside the canvas (affNIST-like ranges), seed {seed}. Not the official affNIST.")
    extra = {k: v for k, v in d.items() if k != "images"}
    return ImageDataset("affine_mnist", split, d["images"], src.labels.clone(), list(src.classes), generated=True,
                        description=desc, extra=extra)
