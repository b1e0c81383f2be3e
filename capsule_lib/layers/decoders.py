"""Decoders that reconstruct the input from the (masked) class capsules."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_tensor

__all__ = ["FCDecoder", "UpsampleConvDecoder"]


class FCDecoder(nn.Module):
    """Reconstruction decoder: masked capsules ``[B, J, D]`` -> image ``[B, *out_shape]`` in [0, 1].

    ``J*D -> hidden[0] -> hidden[1] -> prod(out_shape)``, ReLU then sigmoid (Sabour: 160-512-1024-784).

    Parameters
    ----------
    n_caps : int, optional
        Number of capsules ``J`` (default 10).
    caps_dim : int, optional
        Capsule dimension ``D`` (default 16).
    out_shape : tuple of int, optional
        Shape of one reconstructed image, ``(C, H, W)`` (default ``(1, 28, 28)``).
    hidden : tuple of int, optional
        Widths of the hidden ReLU layers, any number of them (default ``(512, 1024)``).
    """

    def __init__(
        self,
        n_caps: int = 10,
        caps_dim: int = 16,
        out_shape: tuple[int, ...] = (1, 28, 28),
        hidden: tuple[int, ...] = (512, 1024),
    ) -> None:
        super().__init__()
        self.n_caps, self.caps_dim, self.out_shape = n_caps, caps_dim, tuple(out_shape)
        dims = [n_caps * caps_dim, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        n_out = 1
        for s in self.out_shape:
            n_out *= s
        layers += [nn.Linear(dims[-1], n_out), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        """Reconstruct images from masked capsules.

        Parameters
        ----------
        masked : torch.Tensor
            ``[B, n_caps, caps_dim]`` capsules, all but the selected ones zeroed
            (:func:`~capsule_lib.layers.masking.mask_capsules`).

        Returns
        -------
        torch.Tensor
            ``[B, *out_shape]`` images in (0, 1).
        """
        check_tensor(masked, "masked", f"[B, {self.n_caps}, {self.caps_dim}]", [None, self.n_caps, self.caps_dim])
        return self.net(masked.flatten(1)).view(-1, *self.out_shape)


class UpsampleConvDecoder(nn.Module):
    """Efficient-CapsNet's smallNORB decoder: masked capsules ``[B, J, D]`` -> image ``[B, C, 48, 48]``.

    Dense(64) -> reshape 8x8x1 -> 3 x [bilinear x2 upsample, conv 3x3 valid, leaky ReLU] with
    ``channels`` (64, 128, 128) -> conv 3x3 valid to ``out_channels``, sigmoid. Spatial sizes
    8 -> 16 -> 14 -> 28 -> 26 -> 52 -> 50 -> 48. (Its sigmoid output is compared with standardised, signed
    smallNORB targets in the official code, a known quirk of that code.)

    Parameters
    ----------
    n_caps, caps_dim : int, optional
        Number ``J`` and dimension ``D`` of the capsules (defaults 5 and 16).
    out_channels : int, optional
        Channels ``C`` of the reconstructed image (default 2: the stereo pair).
    channels : tuple of int, optional
        Output channels of the upsample-conv blocks, one block each (default ``(64, 128, 128)``; three blocks give
        48x48 images, see :attr:`out_size`).
    slope : float, optional
        Negative slope of the leaky ReLUs (default 0.2).
    """

    def __init__(
        self,
        n_caps: int = 5,
        caps_dim: int = 16,
        out_channels: int = 2,
        channels: tuple[int, ...] = (64, 128, 128),
        slope: float = 0.2,
    ) -> None:
        super().__init__()
        self.n_caps, self.caps_dim, self.out_channels, self.slope = n_caps, caps_dim, out_channels, slope
        self.fc = nn.Linear(n_caps * caps_dim, 64)
        convs, c_in = [], 1
        for c in channels:
            convs.append(nn.Conv2d(c_in, c, 3))
            c_in = c
        self.convs = nn.ModuleList(convs)
        self.out = nn.Conv2d(c_in, out_channels, 3)

    @property
    def out_size(self) -> int:
        """Side of the reconstructed images (48 with three blocks)."""
        h = 8
        for _ in self.convs:
            h = 2 * h - 2
        return h - 2

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        """Reconstruct images from masked capsules.

        Parameters
        ----------
        masked : torch.Tensor
            As in :meth:`FCDecoder.forward`.

        Returns
        -------
        torch.Tensor
            ``[B, out_channels, out_size, out_size]`` images in (0, 1) (``[B, 2, 48, 48]`` by default).
        """
        check_tensor(masked, "masked", f"[B, {self.n_caps}, {self.caps_dim}]", [None, self.n_caps, self.caps_dim])
        h = self.fc(masked.flatten(1)).view(-1, 1, 8, 8)  # [B, 1, 8, 8]
        for conv in self.convs:
            h = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)  # Keras UpSampling2D
            h = F.leaky_relu(conv(h), self.slope)
        return torch.sigmoid(self.out(h))  # [B, C, 48, 48]
