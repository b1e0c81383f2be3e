"""CapsNet of Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules".

Shapes for the MNIST configuration (the default)::

    x            [B, 1, 28, 28]
    conv1        [B, 256, 20, 20]      9x9 conv, ReLU
    primary      [B, 1152, 8]          32 types x 6x6 grid, type-major, squash
    digit caps   [B, 10, 16]           dynamic routing, 3 iterations
    lengths      [B, 10]               class scores
    decoder      [B, 1, 28, 28]        masked by the label (training) or the longest capsule (test)

Images of another side meet the same network behind an :class:`~capsule_lib.layers.ImageStem` (``stem_side=28``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_images, check_model_input, resolve_config
from .._contracts import check_fields, checked
from ..functional import capsule_lengths
from ..layers import FCDecoder, ImageStem, PrimaryCapsules, mask_capsules
from ..routing.dynamic import DynamicRouting
from ..types import CapsuleOutput, ImageContract

__all__ = ["CapsNetConfig", "CapsNet"]


@dataclass
class CapsNetConfig:
    """CapsNet hyper-parameters; the defaults are the paper's MNIST model.

    The properties ``primary_grid`` (side of the primary-capsule grid, 6) and ``n_primary`` (number of primary
    capsules, 1152) follow from the fields.

    Attributes
    ----------
    in_channels : int
        Image channels (default 1).
    image_size : int
        Side of the square input images (default 28).
    conv_channels : int
        Channels of conv1, the ReLU convolution (default 256).
    conv_kernel : int
        Kernel side of conv1, valid padding (default 9).
    primary_types : int
        Primary capsule types (default 32).
    primary_dim : int
        Primary capsule dimension (default 8).
    primary_kernel : int
        Kernel side of the primary-capsule convolution (default 9).
    primary_stride : int
        Its stride (default 2).
    n_classes : int
        Class capsules (default 10).
    class_dim : int
        Class capsule dimension (default 16).
    iterations : int
        Dynamic routing iterations, >= 1 (default 3).
    routing_bias : bool
        Output bias ``b_j`` in R^16 in the routing, as the official code (init 0.1; not counted in the paper's 6.8M)
        (default ``True``).
    leaky : bool
        Leaky routing: an all-zero extra logit before the softmax (default ``False``).
    coupling : str
        ``"parents"`` (default; coefficients sum to 1 over the class capsules) or ``"children"`` (the gram-ai
        softmax-axis bug, for comparison only).
    init_std : float
        Standard deviation of the transformation matrices' normal initialisation (default 0.01).
    decoder : bool
        Build the reconstruction decoder (default ``True``).
    decoder_hidden : tuple of int
        Widths of the decoder's hidden layers (default ``(512, 1024)``).
    mask_k : int
        Capsules kept for reconstruction when no label is given (default 1; 2 for MultiMNIST, where each kept
        capsule is also decoded alone).
    primary_conv : str
        ``"standard"`` (default) or ``"bf16_gemm"``: faster CPU training of the primary-capsule conv (bf16
        numerics).
    stem_side : int or None
        The side an :class:`~capsule_lib.layers.ImageStem` brings the images to before conv1; everything after it
        (primary grid, routing, decoder) is built for that side, so that images of any ``image_size`` meet the
        network of the paper (``stem_side=28``: 1152 primary capsules); the decoder reconstructs the image as the
        stem resizes it. ``None`` (default): no stem, conv1 reads the images.
    """

    in_channels: int = 1
    image_size: int = 28
    conv_channels: int = 256
    conv_kernel: int = 9
    primary_types: int = 32
    primary_dim: int = 8
    primary_kernel: int = 9
    primary_stride: int = 2
    n_classes: int = 10
    class_dim: int = 16
    iterations: int = 3
    routing_bias: bool = True
    leaky: bool = False
    coupling: str = "parents"
    init_std: float = 0.01
    decoder: bool = True
    decoder_hidden: tuple[int, ...] = (512, 1024)
    mask_k: int = 1
    primary_conv: str = "standard"
    stem_side: int | None = None

    @property
    def primary_grid(self) -> int:
        h = (self.stem_side or self.image_size) - self.conv_kernel + 1
        return (h - self.primary_kernel) // self.primary_stride + 1

    @property
    def n_primary(self) -> int:
        return self.primary_types * self.primary_grid**2

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


class CapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> DigitCaps (dynamic routing) -> lengths, with an optional masked decoder.

    ``forward(x, y=None, return_routing=False) -> CapsuleOutput``. With ``y`` (labels ``[B]`` or a
    ``[B, K]`` multi-hot) the decoder reconstructs from the label's capsule(s); without, from the
    ``mask_k`` longest capsules.

    Parameters
    ----------
    config : CapsNetConfig, optional
        The hyper-parameters; ``None`` (default) for ``CapsNetConfig()``, the paper's MNIST model.
    overrides
        Keyword arguments: fields of the config to replace (e.g. ``iterations=1``).
    """

    @checked
    def __init__(self, config: CapsNetConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, CapsNetConfig, overrides)
        if cfg.primary_grid < 1:
            what = "image_size" if cfg.stem_side is None else "stem_side"
            raise ValueError(f"{what} {cfg.stem_side or cfg.image_size} is too small for the conv stack")
        self.config = cfg
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        self.conv1 = nn.Conv2d(self.image_stem.out_channels, cfg.conv_channels, cfg.conv_kernel)
        self.primary = PrimaryCapsules(
            cfg.conv_channels,
            cfg.primary_types,
            cfg.primary_dim,
            cfg.primary_kernel,
            cfg.primary_stride,
            conv=cfg.primary_conv,
        )
        self.digits = DynamicRouting(
            cfg.n_primary,
            cfg.n_classes,
            cfg.primary_dim,
            cfg.class_dim,
            cfg.iterations,
            bias=cfg.routing_bias,
            leaky=cfg.leaky,
            coupling=cfg.coupling,
            init_std=cfg.init_std,
        )
        side = self.image_stem.out_side  # the decoder reconstructs the image as the stem resizes it
        self.decoder = (
            FCDecoder(cfg.n_classes, cfg.class_dim, (cfg.in_channels, side, side), cfg.decoder_hidden)
            if cfg.decoder
            else None
        )

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def primary_capsules(self, x: torch.Tensor) -> torch.Tensor:
        """The primary capsules of images.

        Parameters
        ----------
        x : torch.Tensor
            Images, as in :meth:`forward`.

        Returns
        -------
        torch.Tensor
            ``[B, n_primary, primary_dim]`` (``[B, 1152, 8]`` by default), type-major order (see
            :class:`~capsule_lib.layers.primary.PrimaryCapsules`).
        """
        check_images(x, self.input_contract)
        return self.primary(F.relu(self.conv1(self.image_stem(x))))

    def reconstruct(self, poses: torch.Tensor, y: torch.Tensor | None = None, k: int | None = None) -> torch.Tensor:
        """Decode class capsules masked by ``y`` (or the ``k`` longest); ``ValueError`` without a decoder.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, K, D]`` class capsules.
        y : torch.Tensor, optional
            Labels ``[B]``, labels ``[B, k]`` or a ``[B, K]`` 0/1 mask
            (:func:`~capsule_lib.layers.masking.mask_capsules`); ``None`` (default): the ``k`` longest capsules.
        k : int, optional
            Capsules kept without ``y``; ``None`` (default) uses the config's ``mask_k``.

        Returns
        -------
        torch.Tensor
            ``[B, C, H, W]`` reconstructions in (0, 1).
        """
        if self.decoder is None:
            raise ValueError("this CapsNet was built with decoder=False")
        return self.decoder(mask_capsules(poses, y, k or self.config.mask_k))

    def reconstruct_each(self, poses: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Decode each selected capsule on its own (Sabour et al.'s MultiMNIST segmentation).

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, K, D]`` class capsules.
        y : torch.Tensor, optional
            Labels ``[B, k]`` (``[B]``: k = 1; not a ``[B, K]`` mask, refused); ``None`` (default): the ``mask_k``
            longest capsules, longest first.

        Returns
        -------
        torch.Tensor
            ``[B, k, C, H, W]``: one reconstruction per selected capsule.
        """
        if y is None:
            y = capsule_lengths(poses).topk(self.config.mask_k, dim=1).indices  # [B, k]
        elif y.dim() == 2 and y.shape[1] == poses.shape[1]:
            K = poses.shape[1]
            raise ValueError(f"y: reconstruct_each takes labels [B] or [B, k] (k < {K}), not a mask [B, {K}]")
        y = y.view(-1, 1) if y.dim() == 1 else y  # [B, k]
        return torch.stack([self.reconstruct(poses, y[:, j]) for j in range(y.shape[1])], dim=1)

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        return_routing: bool = False,
        iterations: int | None = None,
    ) -> CapsuleOutput:
        """Images -> digit capsules (and reconstructions).

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1] (``[B, 1, 28, 28]`` by default).
        y : torch.Tensor, optional
            Labels whose capsules the decoder reconstructs from (:meth:`reconstruct`; with ``mask_k > 1``,
            :meth:`reconstruct_each` too, which takes labels only); ``None`` (default): the ``mask_k`` longest.
        return_routing : bool, optional
            Also record the routing's :class:`~capsule_lib.types.RoutingTrace` (default ``False``).
        iterations : int, optional
            Routing iterations for this call, >= 1; ``None`` (default) uses the config's.

        Returns
        -------
        CapsuleOutput
            ``scores`` = capsule lengths ``[B, n_classes]`` (``kind="lengths"``), ``poses``
            ``[B, n_classes, class_dim]``, ``reconstruction [B, C, H, W]`` (``None`` without a decoder), ``trace``
            with ``return_routing``; with ``mask_k > 1``, ``extra["reconstructions"] [B, k, C, H, W]``; with a stem
            that resizes, ``extra["reconstruction_target"]`` (the images as the stem resizes them, what the
            reconstruction is compared with: :func:`~capsule_lib.losses.reconstruction_target`).
        """
        check_model_input(x, self)
        u = self.primary_capsules(x)  # [B, 1152, 8]
        T = {} if iterations is None else {"iterations": iterations}  # (a swapped-in original takes none)
        if return_routing:
            v, trace = self.digits(u, return_routing=True, **T)  # [B, 10, 16]
        else:
            v, trace = self.digits(u, **T), None
        lengths = capsule_lengths(v)  # [B, 10]
        recon, extra = None, {}
        if self.decoder is not None:
            recon = self.reconstruct(v, y)
            if self.config.mask_k > 1:  # MultiMNIST: each kept capsule decoded alone (MultiDigitObjective)
                extra["reconstructions"] = self.reconstruct_each(v, y)  # [B, k, C, H, W]
            if self.image_stem.resizes:  # what the decoder reconstructs: the image as the stem resizes it
                extra["reconstruction_target"] = self.image_stem.resize(x)  # [B, C, stem_side, stem_side]
        return CapsuleOutput(lengths, "lengths", v, recon, trace, extra)
