"""Plain CNN baselines, trained with the same data and budget as the capsule models they are compared to."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_model_input, resolve_config
from .._contracts import check_fields
from ..layers import ImageStem
from ..types import ImageContract

__all__ = ["BaselineCNNConfig", "BaselineCNN"]


@dataclass
class BaselineCNNConfig:
    """Conv(5x5) -> pool -> Conv(5x5) -> pool -> Conv(3x3) -> FC -> FC -> logits, with dropout.

    The defaults (4,681,618 parameters for 28x28 inputs) are of the same order as CapsNet
    without its decoder (6.8M) at about a third of its compute per image, with the hidden widths of Sabour
    et al.'s baseline (328 and 192 units). Sabour's own baseline (256, 256, 128 channels, 35.4M
    parameters) is far more expensive to train on a CPU.

    Attributes
    ----------
    in_channels : int
        Image channels (default 1).
    image_size : int
        Side of the square input images (default 28); the two 2x2 poolings leave ``image_size // 4``.
    channels : tuple of int
        Output channels of the 5x5, 5x5 and 3x3 convolutions ("same" padding, ReLU) (default ``(64, 128, 256)``).
    hidden : tuple of int
        Widths of the two hidden ReLU layers, Sabour et al.'s baseline's (default ``(328, 192)``).
    n_classes : int
        Classes (default 10).
    dropout : float
        Dropout probability after each hidden layer (default 0.5).
    stem_side : int or None
        The side an :class:`~capsule_lib.layers.ImageStem` brings the images to before conv1 (the network after it
        built for that side); ``None`` (default): no stem.
    """

    in_channels: int = 1
    image_size: int = 28
    channels: tuple[int, int, int] = (64, 128, 256)
    hidden: tuple[int, int] = (328, 192)
    n_classes: int = 10
    dropout: float = 0.5
    stem_side: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


class BaselineCNN(nn.Module):
    """``[B, C, H, W] -> logits [B, n_classes]``.

    Parameters
    ----------
    config : BaselineCNNConfig, optional
        The hyper-parameters; ``None`` (default) for ``BaselineCNNConfig()``.
    overrides
        Keyword arguments: fields of the config to replace.
    """

    def __init__(self, config: BaselineCNNConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, BaselineCNNConfig, overrides)
        self.config = cfg
        what, side = ("image_size", cfg.image_size) if cfg.stem_side is None else ("stem_side", cfg.stem_side)
        if side < 4:  # two 2x2 poolings
            raise ValueError(f"{what} {side} is too small for two 2x2 poolings: at least 4")
        c1, c2, c3 = cfg.channels
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        self.conv1 = nn.Conv2d(self.image_stem.out_channels, c1, 5, padding=2)
        self.conv2 = nn.Conv2d(c1, c2, 5, padding=2)
        self.conv3 = nn.Conv2d(c2, c3, 3, padding=1)
        side //= 4
        self.fc1 = nn.Linear(c3 * side * side, cfg.hidden[0])
        self.fc2 = nn.Linear(cfg.hidden[0], cfg.hidden[1])
        self.out = nn.Linear(cfg.hidden[1], cfg.n_classes)
        self.drop = nn.Dropout(cfg.dropout)

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Classify images.

        Dropout (after each hidden layer) is active in training mode only.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1].

        Returns
        -------
        torch.Tensor
            ``[B, n_classes]`` logits.
        """
        check_model_input(x, self)
        h = F.max_pool2d(F.relu(self.conv1(self.image_stem(x))), 2)  # [B, c1, H/2, W/2]
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)  # [B, c2, H/4, W/4]
        h = F.relu(self.conv3(h)).flatten(1)  # [B, c3*H/4*W/4]
        h = self.drop(F.relu(self.fc1(h)))
        h = self.drop(F.relu(self.fc2(h)))
        return self.out(h)  # [B, n_classes]
