"""Batched, vectorised augmentations on ``[B, C, H, W]`` float tensors (run on the training device).

Each takes an explicit ``torch.Generator`` so augmentation is reproducible under a seed (and after a
resume). Only training batches are augmented; evaluation never is.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["random_shift", "shift_images", "random_affine", "affine_images"]


def shift_images(x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Shift each image by integer ``(dx[b], dy[b])`` pixels with zero fill: ``[B, C, H, W] -> same``."""
    B, C, H, W = x.shape
    m = int(max(dx.abs().max().item(), dy.abs().max().item(), 0))
    if m == 0:
        return x
    xp = F.pad(x, (m, m, m, m))  # [B, C, H+2m, W+2m]
    rows = (m - dy).view(B, 1) + torch.arange(H, device=x.device).view(1, H)  # [B, H]
    cols = (m - dx).view(B, 1) + torch.arange(W, device=x.device).view(1, W)  # [B, W]
    b = torch.arange(B, device=x.device).view(B, 1, 1)
    out = xp.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]  # [B, H, W, C]
    return out.permute(0, 3, 1, 2).contiguous()


def random_shift(x: torch.Tensor, max_shift: int = 2, generator: torch.Generator | None = None) -> torch.Tensor:
    """Shift every image independently by up to ``max_shift`` pixels in each direction, zero-filled
    (Sabour et al.: 2 px for MNIST training)."""
    B = x.shape[0]
    d = torch.randint(-max_shift, max_shift + 1, (2, B), generator=generator)
    return shift_images(x, d[0].to(x.device), d[1].to(x.device))


def affine_images(x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Apply per-image 2x3 affine matrices ``theta [B, 2, 3]`` (normalised coordinates, output->input)."""
    grid = F.affine_grid(theta.to(x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_affine(x: torch.Tensor, rotation: float = 20.0, shear: float = 0.1, scale: tuple[float, float] = (0.8, 1.2),
                  translate: float = 0.0, generator: torch.Generator | None = None) -> torch.Tensor:
    """Random rotation (degrees, +-), shear (+-), scale (range) and translation (fraction of the image,
    +-) per image; affNIST ranges are rotation 20, shear 0.1, scale 0.8-1.2."""
    B = x.shape[0]
    u = torch.rand(B, 5, generator=generator)
    ang = torch.deg2rad((u[:, 0] * 2 - 1) * rotation)
    sh = (u[:, 1] * 2 - 1) * shear
    sc = scale[0] + (scale[1] - scale[0]) * u[:, 2]
    tx, ty = (u[:, 3] * 2 - 1) * translate * 2, (u[:, 4] * 2 - 1) * translate * 2
    cos, sin = torch.cos(ang), torch.sin(ang)
    # forward map A = R @ Shear @ S; grid_sample needs the inverse (output -> input)
    A = torch.stack([torch.stack([cos, cos * sh - sin], -1), torch.stack([sin, sin * sh + cos], -1)], 1) * sc[:, None, None]
    Ainv = torch.linalg.inv(A)
    t = torch.stack([tx, ty], -1)
    theta = torch.cat([Ainv, -(Ainv @ t[..., None])], dim=-1)  # [B, 2, 3]
    return affine_images(x, theta.to(x.device))
