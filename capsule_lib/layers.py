"""Capsule building blocks shared by the models: primary capsules, masking and decoders."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_tensor
from .functional import capsule_lengths, squash

__all__ = [
    "PrimaryCapsules", "DepthwisePrimaryCapsules", "mask_capsules", "Mask", "FCDecoder",
]


class PrimaryCapsules(nn.Module):
    """Convolutional primary capsules (Sabour et al. 2017): ``[B, C, H, W] -> [B, n_types*h*w, d_caps]``.

    One convolution with ``n_types * d_caps`` output channels; output channel ``c*d_caps + a`` is
    dimension ``a`` of capsule type ``c`` (the official layout). Capsules are ordered **type-major**,
    ``i = c*h*w + y*w + x`` (the official transpose to ``[B, n_types, h, w, d]``), then squashed over ``d``.
    ``grid(x)`` returns the unflattened ``[B, n_types, h, w, d_caps]`` view for figures.
    """

    def __init__(
        self,
        in_channels: int = 256,
        n_types: int = 32,
        d_caps: int = 8,
        kernel_size: int = 9,
        stride: int = 2,
        squash_kind: str = "hinton",
    ) -> None:
        super().__init__()
        self.in_channels, self.n_types, self.d_caps, self.squash_kind = in_channels, n_types, d_caps, squash_kind
        self.conv = nn.Conv2d(in_channels, n_types * d_caps, kernel_size, stride)

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x", f"[B, C={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, N*D, h, w]
        _, _, H, W = h.shape
        h = h.view(B, self.n_types, self.d_caps, H, W).permute(0, 1, 3, 4, 2)  # [B, N, h, w, D]
        return squash(h, self.squash_kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.grid(x)  # [B, N, h, w, D]
        return g.reshape(g.shape[0], -1, self.d_caps)  # [B, N*h*w, D], type-major


class DepthwisePrimaryCapsules(nn.Module):
    """Efficient-CapsNet primary capsules: depthwise conv ``F x K x K`` (groups=F), valid padding, then
    reshape the ``F`` channels into ``n_caps`` capsules of ``d_caps`` (capsule n = channels
    ``n*d_caps .. n*d_caps+d_caps-1``) and squash_E. ``[B, F, H, W] -> [B, n_caps * h*w, d_caps]``
    (``h = w = 1`` in the papers' configurations).
    """

    def __init__(self, channels: int = 128, kernel_size: int = 9, n_caps: int = 16, d_caps: int = 8,
                 stride: int = 1, squash_kind: str = "efficient") -> None:
        super().__init__()
        if n_caps * d_caps != channels:
            raise ValueError(f"n_caps*d_caps must equal channels ({n_caps}*{d_caps} != {channels})")
        self.channels, self.n_caps, self.d_caps, self.squash_kind = channels, n_caps, d_caps, squash_kind
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x", f"[B, F={self.channels}, H, W]", [None, self.channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, F, h, w]
        h = h.permute(0, 2, 3, 1).reshape(B, -1, self.d_caps)  # [B, h*w*n_caps, D]
        return squash(h, self.squash_kind)


def mask_capsules(v: torch.Tensor, y: torch.Tensor | None = None, k: int = 1) -> torch.Tensor:
    """Zero every capsule except the selected ones: ``[B, J, D] -> [B, J, D]``.

    ``y``: integer labels ``[B]`` (keep the label's capsule), ``[B, k]`` labels, or a ``[B, J]`` 0/1 mask;
    if ``None``, keep the ``k`` longest capsules (``k=2`` for MultiMNIST).
    """
    check_tensor(v, "v", "[B, J, D]", [None, None, None])
    B, J, _ = v.shape
    if y is None:
        idx = capsule_lengths(v).topk(k, dim=1).indices  # [B, k]
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, idx, 1.0)
    elif y.dim() == 1:
        m = F.one_hot(y.long(), J).to(v.dtype)
    elif y.dim() == 2 and y.dtype in (torch.int64, torch.int32) and y.shape[1] != J:
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, y.long(), 1.0)
    elif y.dim() == 2 and y.shape[1] == J:
        m = y.to(v.dtype)
    else:
        raise ValueError(f"y: expected labels [B], [B, k] or a mask [B, {J}], got {tuple(y.shape)}")
    return v * m.unsqueeze(-1)


class Mask(nn.Module):
    """Module form of :func:`mask_capsules`."""

    def __init__(self, k: int = 1) -> None:
        super().__init__()
        self.k = k

    def forward(self, v: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return mask_capsules(v, y, self.k)


class FCDecoder(nn.Module):
    """Reconstruction decoder: masked capsules ``[B, J, D]`` -> image ``[B, *out_shape]`` in [0, 1].

    ``J*D -> hidden[0] -> hidden[1] -> prod(out_shape)``, ReLU then sigmoid (Sabour: 160-512-1024-784).
    """

    def __init__(self, n_caps: int = 10, d_caps: int = 16, out_shape: tuple[int, ...] = (1, 28, 28),
                 hidden: tuple[int, ...] = (512, 1024)) -> None:
        super().__init__()
        self.n_caps, self.d_caps, self.out_shape = n_caps, d_caps, tuple(out_shape)
        dims = [n_caps * d_caps, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        n_out = 1
        for s in self.out_shape:
            n_out *= s
        layers += [nn.Linear(dims[-1], n_out), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        check_tensor(masked, "masked", f"[B, {self.n_caps}, {self.d_caps}]", [None, self.n_caps, self.d_caps])
        return self.net(masked.flatten(1)).view(-1, *self.out_shape)
