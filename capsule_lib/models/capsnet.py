"""CapsNet of Sabour, Frosst & Hinton (2017), "Dynamic Routing Between Capsules".

Shapes for the MNIST configuration (the default)::

    x            [B, 1, 28, 28]
    conv1        [B, 256, 20, 20]      9x9 conv, ReLU
    primary      [B, 1152, 8]          32 types x 6x6 grid, type-major, squash
    digit caps   [B, 10, 16]           dynamic routing, 3 iterations
    lengths      [B, 10]               class scores
    decoder      [B, 1, 28, 28]        masked by the label (training) or the longest capsule (test)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_images, check_model_input
from ..functional import capsule_lengths
from ..layers import FCDecoder, PrimaryCapsules, mask_capsules
from ..routing.dynamic import DynamicRouting
from ..types import CapsuleOutput, ImageContract

__all__ = ["CapsNetConfig", "CapsNet"]


@dataclass
class CapsNetConfig:
    """CapsNet hyper-parameters; the defaults are the paper's MNIST model."""

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
    routing_bias: bool = True  # official code: b_j in R^16, init 0.1 (not counted in the paper's 6.8M)
    leaky: bool = False
    coupling: str = "parents"  # "children" = the gram-ai softmax-axis bug, for comparison only
    init_std: float = 0.01
    decoder: bool = True
    decoder_hidden: tuple[int, ...] = (512, 1024)
    mask_k: int = 1  # capsules kept for reconstruction (2 for MultiMNIST: each is also decoded alone)
    primary_conv: str = "standard"  # "bf16_gemm": faster CPU training of the primary-capsule conv (bf16 numerics)

    @property
    def primary_grid(self) -> int:
        h = self.image_size - self.conv_kernel + 1
        return (h - self.primary_kernel) // self.primary_stride + 1

    @property
    def n_primary(self) -> int:
        return self.primary_types * self.primary_grid**2


class CapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> DigitCaps (dynamic routing) -> lengths, with an optional masked decoder.

    ``forward(x, y=None, return_routing=False) -> CapsuleOutput``. With ``y`` (labels ``[B]`` or a
    ``[B, K]`` multi-hot) the decoder reconstructs from the label's capsule(s); without, from the
    ``mask_k`` longest capsules.
    """

    def __init__(self, config: CapsNetConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = config or CapsNetConfig()
        if overrides:
            cfg = CapsNetConfig(**{**cfg.__dict__, **overrides})
        if cfg.primary_grid < 1:
            raise ValueError(f"image_size {cfg.image_size} is too small for the conv stack")
        self.config = cfg
        self.conv1 = nn.Conv2d(cfg.in_channels, cfg.conv_channels, cfg.conv_kernel)
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
        self.decoder = (
            FCDecoder(
                cfg.n_classes, cfg.class_dim, (cfg.in_channels, cfg.image_size, cfg.image_size), cfg.decoder_hidden
            )
            if cfg.decoder
            else None
        )

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def primary_capsules(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W] -> [B, 1152, 8]`` (type-major order, see :class:`PrimaryCapsules`)."""
        check_images(x, self.input_contract)
        return self.primary(F.relu(self.conv1(x)))

    def reconstruct(self, poses: torch.Tensor, y: torch.Tensor | None = None, k: int | None = None) -> torch.Tensor:
        """Decode class capsules ``[B, K, D]`` masked by ``y`` (or the ``k`` longest)."""
        if self.decoder is None:
            raise ValueError("this CapsNet was built with decoder=False")
        return self.decoder(mask_capsules(poses, y, k or self.config.mask_k))

    def reconstruct_each(self, poses: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        """Decode each selected capsule on its own (Sabour et al.'s MultiMNIST segmentation): ``[B, K, D] ->
        [B, k, C, H, W]``, for ``y`` labels ``[B, k]`` (``[B]``: k = 1) or, without ``y``, the ``mask_k`` longest
        capsules, longest first."""
        if y is None:
            y = capsule_lengths(poses).topk(self.config.mask_k, dim=1).indices  # [B, k]
        y = y.view(-1, 1) if y.dim() == 1 else y  # [B, k]
        return torch.stack([self.reconstruct(poses, y[:, j]) for j in range(y.shape[1])], dim=1)

    def forward(
        self,
        x: torch.Tensor,
        y: torch.Tensor | None = None,
        return_routing: bool = False,
        iterations: int | None = None,
    ) -> CapsuleOutput:
        """Images -> digit capsules (and reconstructions); ``iterations`` overrides the routing's for this call."""
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
        return CapsuleOutput(lengths, "lengths", v, recon, trace, extra)
