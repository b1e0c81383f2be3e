"""Batched, vectorised augmentations on ``[B, C, H, W]`` float tensors (run on the training device).

Each takes an explicit ``torch.Generator`` so augmentation is reproducible under a seed (and after a
resume). Only training batches are augmented; evaluation never is.
"""
from __future__ import annotations

import torch
from .._checks import check_tensor
from .._contracts import checked
import torch.nn.functional as F

__all__ = ["random_shift", "shift_images", "random_affine", "affine_images", "random_crop_flip"]


def shift_images(x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, bound: int | None = None) -> torch.Tensor:
    """Shift each image by integer ``(dx[b], dy[b])`` pixels with zero fill: ``[B, C, H, W] -> same``.

    ``bound``: a known upper bound of ``|dx|`` and ``|dy|`` (the padding); without it the largest shift is read
    from the tensors, which waits for the device (a GPU pipeline stalls on every batch)."""
    B, C, H, W = x.shape
    m = bound if bound is not None else int(max(dx.abs().max().item(), dy.abs().max().item(), 0))
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
    return shift_images(x, d[0].to(x.device), d[1].to(x.device), max_shift)


@checked
def random_crop_flip(x: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """The CIFAR training augmentation, batched: ``RandomCrop(H, padding)`` (zero padding, i.e. a random shift
    of ``-padding..padding`` pixels per axis, uniform) then ``RandomHorizontalFlip(0.5)``, independently per
    image: ``[B, C, H, W] -> same``."""
    check_tensor(x, "random_crop_flip: x", "[B, C, H, W]", [None, None, None, None], floating=False)
    if padding < 0:
        raise ValueError(f"random_crop_flip: padding must be >= 0 pixels, got {padding}")
    B = x.shape[0]
    d = torch.randint(-padding, padding + 1, (2, B), generator=generator)
    flip = torch.rand(B, generator=generator) < 0.5
    x = shift_images(x, d[0].to(x.device), d[1].to(x.device), padding)
    return torch.where(flip.to(x.device).view(B, 1, 1, 1), x.flip(-1), x)


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


# --------------------------------------------------------------------------------------------------------
# Efficient-CapsNet MNIST training augmentation (Mazzia et al. 2021, official utils/pre_process_mnist.py):
# rotation -> margin-aware shift -> squish -> random erase, each drawn independently per image.
# Deterministic helpers (rotate_images, content_margins, squish_images, erase_patches) do the work; the
# random_* functions only draw parameters from an explicit generator.
# --------------------------------------------------------------------------------------------------------
__all__ += ["rotate_images", "random_rotation", "content_margins", "random_margin_shift", "squish_images",
            "random_squish", "erase_patches", "random_erase", "efficient_mnist_augment"]


def _check_images(x: torch.Tensor, name: str = "x") -> None:
    from .._checks import check_tensor

    check_tensor(x, name, "[B, C, H, W]", [None, None, None, None])


def _draw(shape: tuple[int, ...], generator: torch.Generator, kind: str = "normal") -> torch.Tensor:
    dev = generator.device if generator is not None else torch.device("cpu")
    if kind == "normal":
        return torch.randn(shape, generator=generator, device=dev)
    return torch.rand(shape, generator=generator, device=dev)


def rotate_images(x: torch.Tensor, degrees: torch.Tensor, center: tuple[float, float] | None = None) -> torch.Tensor:
    """Rotate each image by ``degrees[b]`` (positive = counter-clockwise as displayed), bilinear, zero fill:
    ``[B, C, H, W] -> same``.

    Matches OpenCV's ``warpAffine(img, getRotationMatrix2D(center, angle, 1), (W, H))`` used by the official
    code: the centre is given in pixel-index coordinates (pixel centres at integers) and defaults to
    ``(W/2, H/2)`` = (14, 14) for MNIST (OpenCV's convention, half a pixel off the geometric centre 13.5).
    OpenCV interpolates with 1/32-pixel fixed-point weights; this uses exact float weights.
    """
    _check_images(x)
    B, C, H, W = x.shape
    cx, cy = center if center is not None else (W / 2.0, H / 2.0)
    th = torch.deg2rad(degrees.to(device=x.device, dtype=torch.float32)).view(B, 1, 1)
    cos, sin = torch.cos(th), torch.sin(th)
    yd = torch.arange(H, device=x.device, dtype=torch.float32).view(1, H, 1) - cy  # destination pixel
    xd = torch.arange(W, device=x.device, dtype=torch.float32).view(1, 1, W) - cx
    xs = cos * xd - sin * yd + cx  # [B, H, W] source pixel (inverse of OpenCV's source->destination map)
    ys = sin * xd + cos * yd + cy
    grid = torch.stack([xs * (2.0 / (W - 1)) - 1.0, ys * (2.0 / (H - 1)) - 1.0], dim=-1)  # [B, H, W, 2]
    out = F.grid_sample(x.float(), grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    return out.to(x.dtype)


def random_rotation(x: torch.Tensor, generator: torch.Generator, max_degrees: float = 30.0, std: float = 0.33,
                    p: float = 0.5, integer_degrees: bool = True) -> torch.Tensor:
    """Official random rotation: ``angle = max_degrees * clip(N(0, std), +-0.9999)`` degrees, applied with
    probability ``p`` (official: when a second ``clip(N(0, .33))`` draw is <= 0, i.e. p = 0.5).
    ``integer_degrees``: truncate the angle toward zero, as the official ``int(angle)`` does."""
    _check_images(x)
    B = x.shape[0]
    ang = _draw((B,), generator).mul_(std).clamp_(-0.9999, 0.9999).mul_(max_degrees)
    if integer_degrees:
        ang = torch.trunc(ang)
    apply = _draw((B,), generator, "uniform") < p
    ang = torch.where(apply, ang, torch.zeros_like(ang)).to(x.device)
    keep = (ang == 0).view(B, 1, 1, 1)
    return torch.where(keep, x, rotate_images(x, ang))


def content_margins(x: torch.Tensor) -> torch.Tensor:
    """Empty rows/columns around the content (pixels > 0 in any channel): ``[B, C, H, W] -> [B, 4]`` as
    ``(left, right, top, bottom)``; an all-zero image has margins 0."""
    _check_images(x)
    B, C, H, W = x.shape
    mask = (x > 0).any(dim=1)  # [B, H, W]
    cols, rows = mask.any(dim=1), mask.any(dim=2)  # [B, W], [B, H]
    left = cols.float().argmax(dim=1)  # first column with content (0 if none)
    right = cols.flip(1).float().argmax(dim=1)
    top = rows.float().argmax(dim=1)
    bottom = rows.flip(1).float().argmax(dim=1)
    return torch.stack([left, right, top, bottom], dim=1)


def random_margin_shift(x: torch.Tensor, generator: torch.Generator, std: float = 0.33) -> torch.Tensor:
    """Official margin-aware shift: per axis a fraction ``a = min(|N(0, std)|, 0.9999)`` of the free margin on a
    random side, ``floor(-a * left)`` or ``floor(a * (1 + right))`` pixels (likewise for rows). The content
    never leaves the image (so the official ``tf.roll`` equals this zero-filled shift)."""
    _check_images(x)
    B = x.shape[0]
    m = content_margins(x).float()  # [B, 4], on x's device (no wait for it)
    a = _draw((B, 2), generator).abs_().mul_(std).clamp_(max=0.9999).to(m.device)  # [B, 2] (x, y)
    side = _draw((B, 2), generator, "uniform").to(m.device) < 0.5  # [B, 2] True = towards left / top
    dx = torch.where(side[:, 0], torch.floor(-a[:, 0] * m[:, 0]), torch.floor(a[:, 0] * (1 + m[:, 1])))
    dy = torch.where(side[:, 1], torch.floor(-a[:, 1] * m[:, 2]), torch.floor(a[:, 1] * (1 + m[:, 3])))
    return shift_images(x, dx.long(), dy.long(), max(x.shape[-2:]))  # |shift| <= the free margin < the side


def _lanczos3(t: torch.Tensor) -> torch.Tensor:
    out = torch.sinc(t) * torch.sinc(t / 3.0)
    return torch.where(t.abs() < 3.0, out, torch.zeros_like(out))


def squish_images(x: torch.Tensor, width_mod: torch.Tensor, offset: torch.Tensor, kernel: str = "lanczos3",
                  clamp: bool = True) -> torch.Tensor:
    """Resize each image horizontally from ``W`` to ``W - width_mod[b]`` columns and place it at column
    ``offset[b]`` of a zero ``W``-wide canvas (columns past ``W`` are cropped): ``[B, C, H, W] -> same``.

    The resampling is one ``[B, W, W]`` matrix per image with TF's ``scale_and_translate`` antialiased
    weights: ``k((x + 0.5 - (u + 0.5) * W / W') / s)`` with ``s = W / W'``, normalised over the input
    columns ``x``. ``kernel="lanczos3"`` (official ``tf.image.resize(..., LANCZOS3, antialias=True)``) or
    ``"bilinear"`` (triangle kernel; never leaves the input range). ``clamp`` clips the result to
    ``[0, 1]`` (Lanczos rings slightly outside it; the official code does not clip).
    """
    _check_images(x)
    if kernel not in ("lanczos3", "bilinear"):
        raise ValueError(f"kernel must be 'lanczos3' or 'bilinear', got {kernel!r}")
    B, C, H, W = x.shape
    dev = x.device
    wm = width_mod.to(dev, torch.float32).view(B, 1, 1)
    new_w = W - wm  # [B, 1, 1]
    scale = W / new_w  # input pixels per output pixel (>= 1: downscaling)
    o = torch.arange(W, device=dev, dtype=torch.float32).view(1, W, 1)  # output column
    u = o - offset.to(dev, torch.float32).view(B, 1, 1)  # column inside the resized image
    xin = torch.arange(W, device=dev, dtype=torch.float32).view(1, 1, W)  # input column
    t = (xin + 0.5 - (u + 0.5) * scale) / scale  # [B, W, W]
    w = _lanczos3(t) if kernel == "lanczos3" else (1.0 - t.abs()).clamp_min(0.0)
    w = w / w.sum(dim=2, keepdim=True).clamp_min(1e-12)
    inside = (u >= 0) & (u < new_w)  # [B, W, 1]
    M = torch.where(inside, w, torch.zeros_like(w))  # [B, W_out, W_in]
    out = torch.einsum("bchx,box->bcho", x.float(), M)  # [B, C, H, W]
    if clamp:
        out = out.clamp(0.0, 1.0)
    return out.to(x.dtype)


def random_squish(x: torch.Tensor, generator: torch.Generator, std: float = 0.33, kernel: str = "lanczos3",
                  clamp: bool = True) -> torch.Tensor:
    """Official "squish": ``width_mod = floor(a0 * W/4 + 1)`` (1..7 px for MNIST),
    ``offset = width_mod // 2 + floor(a1 * 2)`` with ``a = min(|N(0, std)|, 0.9999)``; see :func:`squish_images`
    (``kernel="bilinear"`` is the cheap alternative to the official Lanczos3)."""
    _check_images(x)
    B, W = x.shape[0], x.shape[-1]
    a = _draw((B, 2), generator).abs_().mul_(std).clamp_(max=0.9999)
    width_mod = torch.floor(a[:, 0] * (W / 4) + 1).long()
    offset = width_mod // 2 + torch.floor(a[:, 1] * 2.0).long()
    return squish_images(x, width_mod, offset, kernel, clamp)


def erase_patches(x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, size: int = 4) -> torch.Tensor:
    """Zero a ``size x size`` patch (all channels) with corner ``(top[b], left[b])`` in each image."""
    _check_images(x)
    B, C, H, W = x.shape
    r = torch.arange(H, device=x.device).view(1, H, 1)
    c = torch.arange(W, device=x.device).view(1, 1, W)
    t, l = top.to(x.device).view(B, 1, 1), left.to(x.device).view(B, 1, 1)
    patch = (r >= t) & (r < t + size) & (c >= l) & (c < l + size)  # [B, H, W]
    return x.masked_fill(patch.unsqueeze(1), 0.0)


def random_erase(x: torch.Tensor, generator: torch.Generator, size: int = 4, low: int = 4,
                 high: int | None = None) -> torch.Tensor:
    """Official random erase: a ``size x size`` patch whose corner (row, column) is uniform in
    ``[low, high]`` (official: ``floor(U * 19) + 4``, i.e. [4, 22] for 28x28; ``high`` defaults to
    ``H - size - 2``)."""
    _check_images(x)
    B, _, H, W = x.shape
    high = H - size - 2 if high is None else high
    n = high - low + 1
    uv = _draw((B, 2), generator, "uniform")
    corner = torch.floor(uv * n).long().clamp_(max=n - 1) + low  # [B, 2]
    return erase_patches(x, corner[:, 0], corner[:, 1], size)


def efficient_mnist_augment(x: torch.Tensor, generator: torch.Generator, squish_kernel: str = "lanczos3") -> torch.Tensor:
    """The official Efficient-CapsNet MNIST training augmentation, in its order: :func:`random_rotation`
    (p = 0.5, up to +-30 deg) -> :func:`random_margin_shift` -> :func:`random_squish` -> :func:`random_erase`.
    ``[B, C, H, W]`` in [0, 1] -> same."""
    x = random_rotation(x, generator)
    x = random_margin_shift(x, generator)
    x = random_squish(x, generator, kernel=squish_kernel)
    return random_erase(x, generator)

