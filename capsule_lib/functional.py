"""Squash variants, a gradient-safe norm and capsule lengths: pure functions plus thin ``nn.Module`` wrappers.

All functions compute in float32 when given float16/bfloat16 (norms of large capsules overflow fp16) and
return the input dtype, so they are safe under autocast.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_tensor
from ._contracts import check_value

__all__ = [
    "coordinate_channels",
    "add_coordinate_channels",
    "safe_norm",
    "SQUASH_KINDS",
    "squash_hinton",
    "squash_efficient",
    "squash_hinton_no_eps",
    "squash_hinton_eps_norm",
    "squash",
    "capsule_lengths",
    "SafeNorm",
    "Squash",
    "Length",
]


def _up(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def safe_norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-8, keepdim: bool = False) -> torch.Tensor:
    """``sqrt(sum(x**2) + eps)`` over ``dim``.

    Unlike ``x.norm()``, the gradient at ``x = 0`` is finite (it is 0), so a capsule that is exactly zero
    does not produce NaN gradients. ``[..., d] -> [...]`` (or ``[..., 1]`` with ``keepdim``).
    """
    xf = _up(x)
    n = torch.sqrt(xf.pow(2).sum(dim=dim, keepdim=keepdim) + eps)
    return n.to(x.dtype)


def _check_squash_input(s: torch.Tensor, dim: int, eps: float, name: str) -> None:
    """One line for what no squash can take (a forward pass calls the squashes: plain checks, no decorator)."""
    check_tensor(s, f"{name}: s", "[..., d]", [None], min_leading=0)
    check_value(dim, int, f"{name}: dim")
    check_value(eps, float, f"{name}: eps")


def squash_hinton(s: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Sabour et al. (2017) squash ``v = |s|^2 / (1 + |s|^2) * s / |s|``; ``[..., d] -> [..., d]``.

    Written as ``s / (n + 1/n)`` with ``n = safe_norm(s)``: no division by zero at ``s = 0``, no overflow of
    ``n**2`` for huge capsules, output norm in ``[0, 1)``.
    """
    _check_squash_input(s, dim, eps, "squash_hinton")
    sf = _up(s)
    n = torch.sqrt(sf.pow(2).sum(dim=dim, keepdim=True) + eps)
    v = sf / (n + 1.0 / n)
    return v.to(s.dtype)


def squash_efficient(s: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Mazzia et al. (2021) squash ``v = (1 - 1/e^{|s|}) * s / |s|``; ``[..., d] -> [..., d]``.

    Uses ``-expm1(-n)`` for ``1 - e^{-n}`` (exact near 0, no overflow for large ``n``) and the safe norm,
    so unlike the original (epsilon outside the root) the gradient at ``s = 0`` is finite.
    """
    sf = _up(s)
    n = torch.sqrt(sf.pow(2).sum(dim=dim, keepdim=True) + eps)
    v = -torch.expm1(-n) * sf / n
    return v.to(s.dtype)


def squash_hinton_no_eps(s: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """squash_H as gram-ai/capsule-networks, acburigo/CapsNet and the official TensorFlow code write it,
    ``|s|^2 / (1 + |s|^2) * s / |s|`` with no epsilon: **NaN at** ``s = 0`` (value and gradient). Only for
    reproducing those implementations (:class:`~capsule_lib.routing.dynamic.DynamicRouting` presets); use
    :func:`squash_hinton`. ``[..., d] -> [..., d]``."""
    sf = _up(s)
    n2 = sf.pow(2).sum(dim=dim, keepdim=True)  # |s|^2
    return (n2 / (1 + n2) * sf / torch.sqrt(n2)).to(s.dtype)


def squash_hinton_eps_norm(s: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """squash_H as XifengGuo/CapsNet-Pytorch writes it: ``|s|^2 / (1 + |s|^2) / (|s| + eps) * s``, epsilon
    added to the norm outside the root (finite at ``s = 0``, where PyTorch's norm has the subgradient 0; for
    ``|s|`` far below ``eps`` its scale ``|s|^2 / (1 + |s|^2) / (|s| + eps)`` is about ``|s|^2 / eps`` instead of
    the formula's ``|s|``). Only for reproducing that implementation; use
    :func:`squash_hinton`. ``[..., d] -> [..., d]``."""
    sf = _up(s)
    n = torch.linalg.vector_norm(sf, dim=dim, keepdim=True)  # |s|
    return (n.pow(2) / (1 + n.pow(2)) / (n + eps) * sf).to(s.dtype)


_SQUASH = {
    "hinton": squash_hinton,
    "sabour": squash_hinton,
    "efficient": squash_efficient,
    "hinton_no_eps": lambda s, dim=-1, eps=None: squash_hinton_no_eps(s, dim),  # no epsilon to pass
    "hinton_eps_norm": squash_hinton_eps_norm,
}
#: the kinds :func:`squash` knows
SQUASH_KINDS: tuple[str, ...] = tuple(sorted(_SQUASH))


def squash(s: torch.Tensor, kind: str = "hinton", dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Dispatch to a squash variant: ``"hinton"``/``"sabour"`` (squash_H, ours: safe at 0), ``"efficient"``
    (squash_E), or, to reproduce other implementations, ``"hinton_no_eps"`` (gram-ai, acburigo, official; ``eps``
    unused) and ``"hinton_eps_norm"`` (XifengGuo)."""
    try:
        fn = _SQUASH[kind]
    except KeyError:
        raise ValueError(f"unknown squash kind {kind!r}; expected one of {sorted(_SQUASH)}") from None
    return fn(s, dim=dim, eps=eps)


def capsule_lengths(v: torch.Tensor, dim: int = -1, eps: float = 1e-8) -> torch.Tensor:
    """Capsule lengths ``|v|`` (the class probabilities of a capsule layer): ``[..., n, d] -> [..., n]``."""
    check_tensor(v, "capsule_lengths: v", "[..., d]", [None], min_leading=0)
    check_value(dim, int, "capsule_lengths: dim")
    check_value(eps, float, "capsule_lengths: eps")
    return safe_norm(v, dim=dim, eps=eps)


class SafeNorm(nn.Module):
    """Module form of :func:`safe_norm`."""

    def __init__(self, dim: int = -1, eps: float = 1e-8, keepdim: bool = False) -> None:
        super().__init__()
        self.dim, self.eps, self.keepdim = dim, eps, keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return safe_norm(x, self.dim, self.eps, self.keepdim)


class Squash(nn.Module):
    """Module form of :func:`squash` (any of its kinds: ``"hinton"``, ``"efficient"``, ``"hinton_no_eps"``, ...)."""

    def __init__(self, kind: str = "hinton", dim: int = -1, eps: float = 1e-8) -> None:
        super().__init__()
        if kind not in _SQUASH:
            raise ValueError(f"unknown squash kind {kind!r}; expected one of {sorted(_SQUASH)}")
        self.kind, self.dim, self.eps = kind, dim, eps

    def forward(self, s: torch.Tensor) -> torch.Tensor:
        return squash(s, self.kind, self.dim, self.eps)

    def extra_repr(self) -> str:
        return f"kind={self.kind!r}, eps={self.eps}"


class Length(nn.Module):
    """Module form of :func:`capsule_lengths`: ``[B, n, d] -> [B, n]``."""

    def __init__(self, eps: float = 1e-8) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return capsule_lengths(v, eps=self.eps)


# ----------------------------------------------------------------------------------------- coordinates
def coordinate_channels(
    height: int, width: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The two coordinate channels ``[2, H, W]``: channel 0 is ``linspace(-1, 1, H)`` down the rows (constant
    along a row), channel 1 is ``linspace(-1, 1, W)`` across the columns."""
    ys = torch.linspace(-1.0, 1.0, height, device=device, dtype=dtype)  # [H]
    xs = torch.linspace(-1.0, 1.0, width, device=device, dtype=dtype)  # [W]
    return torch.stack((ys[:, None].expand(height, width), xs[None, :].expand(height, width)))  # [2, H, W]


def add_coordinate_channels(x: torch.Tensor) -> torch.Tensor:
    """Append the coordinate channels to images: ``[..., C, H, W] -> [..., C + 2, H, W]``."""
    h, w = x.shape[-2:]
    grid = coordinate_channels(h, w, x.device, x.dtype).expand(*x.shape[:-3], 2, h, w)  # [..., 2, H, W]
    return torch.cat((x, grid), dim=-3)
