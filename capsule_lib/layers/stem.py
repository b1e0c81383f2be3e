"""The image stem: images of any side brought to the side a paper's network reads, so that the network behind it
keeps its number of primary capsules and its size (issue #63).

A capsule network's primary grid grows with the image: CapsNet reads 64 x 64 RGB images with 18,432 primary
capsules and a 27.9M-parameter network whose votes saturate the squash. :class:`ImageStem` halves a large image
with learned 3x3 stride-2 convolutions (each followed by BatchNorm and ReLU, ``width`` channels) while it is at
least twice the target side, then lands exactly on the target side with a parameter-free area resize
(:func:`resize_images`); a smaller image is upsampled bilinearly. The network behind it is built for the target
side (``stem_side`` in every image model's config) and so keeps the paper's primary capsules, routing fan-in and
decoder.

Shapes for a 224 x 224 RGB image and CapsNet's side 28::

    x        [B, 3, 224, 224]
    conv s2  [B, 32, 112, 112]   3x3, stride 2, BatchNorm, ReLU
    conv s2  [B, 32, 56, 56]
    conv s2  [B, 32, 28, 28]     56 >= 2 * 28: one more halving
    resize   [B, 32, 28, 28]     area (nothing to do here)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._contracts import checked

__all__ = ["ImageStem", "resize_images", "STEM_WIDTH"]

#: channels of the stem's convolutions (what the network behind a stem with convolutions reads)
STEM_WIDTH = 32


def resize_images(x: torch.Tensor, side: int) -> torch.Tensor:
    """Images brought to ``side x side`` without parameters: an area resize (the mean of the pixels each output
    pixel covers) to a smaller side, bilinear upsampling to a larger one, the images themselves at their side.

    Parameters
    ----------
    x : torch.Tensor
        ``[B, C, H, W]`` images or feature maps.
    side : int
        The side wanted, >= 1.

    Returns
    -------
    torch.Tensor
        ``[B, C, side, side]``.
    """
    if side < 1:
        raise ValueError(f"side must be >= 1, got {side}")
    h, w = x.shape[-2:]
    if (h, w) == (side, side):
        return x
    if h >= side and w >= side:
        return F.interpolate(x, size=(side, side), mode="area")
    return F.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)


class ImageStem(nn.Module):
    """Images ``[B, in_channels, image_size, image_size]`` -> ``[B, out_channels, side, side]``.

    While the side is at least twice ``side``, a 3x3 stride-2 convolution (padding 1, no bias) + BatchNorm + ReLU
    halves it (``width`` channels; the side becomes ``ceil(s / 2)``); :func:`resize_images` then lands on ``side``
    exactly. Without a halving the stem has no parameters and ``out_channels = in_channels``; with ``side=None`` or
    ``side == image_size`` it is the identity (the network of the paper, its ``state_dict`` unchanged).

    Parameters
    ----------
    in_channels : int
        Image channels.
    image_size : int
        Side of the square input images, >= 1.
    side : int or None, optional
        The side the network behind the stem reads (e.g. 28 for CapsNet); ``None`` (default): no stem.
    width : int, optional
        Channels of the convolutions (default :data:`STEM_WIDTH`, 32).

    Attributes
    ----------
    convs : nn.Sequential
        The halving convolutions (empty when none is needed).
    out_channels : int
        Channels of the output: ``width`` after a convolution, else ``in_channels``.
    out_side : int
        Side of the output: ``side``, or ``image_size`` without a stem.
    """

    @checked
    def __init__(self, in_channels: int, image_size: int, side: int | None = None, width: int = STEM_WIDTH) -> None:
        super().__init__()
        for name, value in (("in_channels", in_channels), ("image_size", image_size), ("width", width)):
            if value < 1:
                raise ValueError(f"ImageStem: {name} must be >= 1, got {value}")
        if side is not None and side < 1:
            raise ValueError(f"ImageStem: side must be >= 1 (or None: no stem), got {side}")
        self.in_size, self.out_side = image_size, image_size if side is None else side
        layers: list[nn.Module] = []
        s, c = image_size, in_channels
        while s >= 2 * self.out_side:
            layers += [nn.Conv2d(c, width, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU()]
            s, c = (s + 1) // 2, width
        self.convs = nn.Sequential(*layers)
        self.out_channels = c
        self.halvings = len(layers) // 3

    @property
    def resizes(self) -> bool:
        """Whether the stem changes the images (``False``: the identity, the paper's network)."""
        return self.out_side != self.in_size

    def describe(self) -> str | None:
        """The stem in words (``"224 px -> 3 stride-2 convs (32 channels) -> 28 px"``); ``None`` for the identity."""
        if not self.resizes:
            return None
        if not self.halvings:
            how = "area resize" if self.in_size > self.out_side else "bilinear upsampling"
            return f"{self.in_size} px -> {how} -> {self.out_side} px"
        convs = f"{self.halvings} stride-2 conv{'s' if self.halvings > 1 else ''} ({self.out_channels} channels)"
        return f"{self.in_size} px -> {convs} -> {self.out_side} px"

    def resize(self, x: torch.Tensor) -> torch.Tensor:
        """The images resized to the stem's output side without parameters (:func:`resize_images`): what a network
        with a decoder reconstructs (``CapsuleOutput.extra["reconstruction_target"]``).

        Parameters
        ----------
        x : torch.Tensor
            ``[B, C, image_size, image_size]`` images.

        Returns
        -------
        torch.Tensor
            ``[B, C, out_side, out_side]``.
        """
        return resize_images(x, self.out_side)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the module.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images.

        Returns
        -------
        torch.Tensor
            ``[B, out_channels, out_side, out_side]`` (``x`` itself for the identity).
        """
        if not self.resizes:
            return x
        return resize_images(self.convs(x), self.out_side)

    def extra_repr(self) -> str:
        return f"{self.in_size} -> {self.out_side}"
