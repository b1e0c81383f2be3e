"""The CNN backbones in front of Tsai et al.'s capsule layers (and of the comparison's backbone-only baseline).

``"resnet"``: the official ``resnet_backbone`` (conv-BN-ReLU, 3 BasicBlocks(64), 4 BasicBlocks(128, s2));
``"simple"``: one conv3x3 s2 p1 + ReLU. :func:`build_backbone` builds the one a
:class:`~capsule_lib.models.inverted.CapsModelConfig` names; the input normalisation helpers are shared by
:class:`~capsule_lib.models.inverted.CapsModel` and :class:`~capsule_lib.models.inverted.BackboneClassifier`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_choice
from ..types import ImageContract

__all__ = ["BasicBlock", "ResNetBackbone", "SimpleBackbone", "build_backbone"]

_BACKBONES = ("resnet", "simple")


# ------------------------------------------------------------------------------------------- backbones
class BasicBlock(nn.Module):
    """CIFAR ResNet basic block: ``relu(BN(conv3x3(relu(BN(conv3x3(x))))) + shortcut(x))``, convs without
    bias; the shortcut is a 1x1 conv (no bias) + BN when the stride or the width changes, else identity.

    Parameters
    ----------
    in_planes : int
        Input channels.
    planes : int
        Output channels.
    stride : int, optional
        Stride of the first conv and of the shortcut (default 1).
    """

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the module.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_planes, H, W]`` features.

        Returns
        -------
        torch.Tensor
            ``[B, planes, H', W']``, ``H' = (H - 1) // stride + 1``.
        """
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNetBackbone(nn.Module):
    """The official ``resnet_backbone``: conv3x3(in -> stem, s1, p1, no bias) -> BN -> ReLU ->
    ``blocks[0]`` BasicBlocks(stem, s1) -> ``blocks[1]`` BasicBlocks(channels, first with ``stride``).

    Parameters
    ----------
    in_channels : int, optional
        Image channels (default 3).
    channels : int, optional
        Output channels of the second stage (default 128).
    stride : int, optional
        Stride of the second stage's first block (default 2).
    stem : int, optional
        Channels of the stem and of the first stage (default 64).
    blocks : tuple of int, optional
        BasicBlocks in the two stages (default ``(3, 4)``).
    """

    def __init__(
        self,
        in_channels: int = 3,
        channels: int = 128,
        stride: int = 2,
        stem: int = 64,
        blocks: tuple[int, int] = (3, 4),
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, stem, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(stem),
            nn.ReLU(),
        ]
        in_planes = stem
        for planes, n_blocks, first_stride in ((stem, blocks[0], 1), (channels, blocks[1], stride)):
            for st in [first_stride] + [1] * (n_blocks - 1):
                layers.append(BasicBlock(in_planes, planes, st))
                in_planes = planes
        self.pre_caps = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the module.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` images (normalised by the model first when its config has ``input_mean``).

        Returns
        -------
        torch.Tensor
            ``[B, channels, h, w]`` (``[B, 128, 16, 16]`` for 32x32 images).
        """
        return self.pre_caps(x)


class SimpleBackbone(nn.Module):
    """The official ``simple_backbone``: conv(in -> channels, k, stride, padding, with bias) + ReLU.

    Parameters
    ----------
    in_channels : int, optional
        Image channels (default 3).
    channels : int, optional
        Output channels (default 128).
    kernel_size : int, optional
        Kernel side ``k`` (default 3).
    stride : int, optional
        Stride (default 2).
    padding : int, optional
        Zero padding (default 1).
    """

    def __init__(
        self, in_channels: int = 3, channels: int = 128, kernel_size: int = 3, stride: int = 2, padding: int = 1
    ) -> None:
        super().__init__()
        self.pre_caps = nn.Sequential(nn.Conv2d(in_channels, channels, kernel_size, stride, padding), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the module.

        Parameters
        ----------
        x : torch.Tensor
            Images, as in :meth:`ResNetBackbone.forward`.

        Returns
        -------
        torch.Tensor
            ``[B, channels, h, w]``, ``h = (H + 2*padding - kernel_size) // stride + 1`` (``[B, 128, 16, 16]`` for
            32x32 images).
        """
        return self.pre_caps(x)


def build_backbone(cfg, in_channels: int | None = None) -> nn.Module:
    """The backbone a :class:`~capsule_lib.models.inverted.CapsModelConfig` names, shared by
    :class:`~capsule_lib.models.inverted.CapsModel` and :class:`~capsule_lib.models.inverted.BackboneClassifier`.

    Parameters
    ----------
    cfg : CapsModelConfig
        Its ``backbone`` (``"resnet"`` or ``"simple"``; others raise ``ValueError``) and backbone fields.
    in_channels : int, optional
        The channels the backbone reads; ``None`` (default): the config's ``in_channels`` (an
        :class:`~capsule_lib.layers.ImageStem` with convolutions in front gives its own).

    Returns
    -------
    nn.Module
        A :class:`ResNetBackbone` or :class:`SimpleBackbone`.
    """
    check_choice(cfg.backbone, _BACKBONES, "backbone")
    c = cfg.in_channels if in_channels is None else in_channels
    if cfg.backbone == "resnet":
        return ResNetBackbone(c, cfg.backbone_channels, cfg.backbone_stride, cfg.resnet_stem, cfg.resnet_blocks)
    return SimpleBackbone(c, cfg.backbone_channels, cfg.backbone_kernel, cfg.backbone_stride, cfg.backbone_padding)


def _register_input_norm(module: nn.Module, cfg) -> None:
    """Buffers ``input_mean`` / ``input_std`` ``[1, C, 1, 1]`` (or ``None``)."""
    if cfg.input_mean is None:
        module.input_mean = module.input_std = None
        return
    module.register_buffer("input_mean", torch.tensor(cfg.input_mean).view(1, -1, 1, 1), persistent=False)
    module.register_buffer("input_std", torch.tensor(cfg.input_std).view(1, -1, 1, 1), persistent=False)


def _input_contract(cfg) -> ImageContract:
    """Images in [0, 1] (normalised inside when the config has ``input_mean``: ``predict`` refuses already-normalised
    or 0-255 float input)."""
    return ImageContract(cfg.in_channels, cfg.image_size)


def _normalise(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    if module.input_mean is None:
        return x
    return (x - module.input_mean.to(x.dtype)) / module.input_std.to(x.dtype)
