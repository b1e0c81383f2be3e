"""Capsule network with inverted dot-product attention routing (Tsai et al., ICLR 2020).

"Capsules with Inverted Dot-Product Attention Routing"; official code ``apple/ml-capsules-inverted-attention-routing``
(``src/capsule_model.py``, ``src/layers.py``, ``configs/resnet_backbone_CIFAR{10,100}.json``).

Shapes for the CIFAR-10 configuration (the default, ``CapsModelConfig.cifar10()``)::

    x              [B, 3, 32, 32]
    backbone       [B, 128, 16, 16]        "resnet" (conv-BN-ReLU, 3 BasicBlocks(64), 4 BasicBlocks(128, s2))
                                           or "simple" (conv3x3 s2 p1 + ReLU)
    primary        [B, 32, 16, 16, 16]     conv1x1 (no bias), channels-last split into (32, d), LayerNorm_d
    CONV caps 1    [B, 32, 7, 7, 16]       k3 s2, 4x4 matrix poses
    CONV caps 2    [B, 32, 5, 5, 16]       k3 s1
    class caps     [B, 10, 16]             FC from the 800 = 32*5*5 capsules (type-major)
    logits         [B, 10]                 final_fc: one Linear(d -> 1) shared by every class

CIFAR-100 (``CapsModelConfig.cifar100()``) uses d = 36 (6x6 poses) and an extra FC layer (800 -> 20)
before the class capsules (20 -> 100).

Every capsule layer performs one routing update per call; ``iterations`` = T and ``sequential_routing``
choose how the updates of the layers are interleaved (see :meth:`CapsModel.route`).

Differences from the official code (the paper is silent on all of them):

* the CONV windows are gathered correctly (``unfold``); ``expansion="official_bug"`` reproduces the official
  ``input_expansion`` (apple PR #1) for comparison;
* the logits are ``final_fc(poses).squeeze(-1)``, so they stay ``[B, K]`` at batch size 1 (the official
  ``out.squeeze()`` returns ``[K]`` there);
* ``iterations`` defaults to 2 (the official README recommends more than one routing iteration, and its best
  results use it) whereas the command line default is 1 (no agreement step at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
from torch import nn

from .._checks import check_choice, check_images, check_iterations, check_model_input
from .._contracts import check_fields, checked
from ..layers import ImageStem, InvertedPrimaryCapsules
from ..routing.inverted import EXPANSIONS, InvertedConvCapsules, InvertedFCCapsules
from ..types import CapsuleOutput, ImageContract, RoutingTrace
from .backbones import (
    _input_contract,
    _normalise,
    _register_input_norm,
    build_backbone,
)

__all__ = [
    "CapsLayerSpec",
    "CapsModelConfig",
    "CapsModel",
    "BackboneClassifier",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
]

#: the official CIFAR normalisation (``main_capsule.py``: ``transforms.Normalize`` after the augmentation)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)


# ---------------------------------------------------------------------------------------------- config
@dataclass(frozen=True)
class CapsLayerSpec:
    """One capsule layer between the primary and the class capsules.

    Attributes
    ----------
    kind : str
        ``"conv"`` (valid ``k x k`` windows with ``stride``) or ``"fc"``.
    n_caps : int
        The number of output types (CONV) or capsules (FC).
    kernel_size : int
        Window side ``k``, CONV only (default 3).
    stride : int
        Window stride, CONV only (default 1).
    """

    kind: str
    n_caps: int
    kernel_size: int = 3
    stride: int = 1


@dataclass
class CapsModelConfig:
    """Hyper-parameters of :class:`CapsModel`; the defaults are the official CIFAR-10 resnet configuration.

    Use the presets ``CapsModelConfig.cifar10(backbone="resnet"|"simple", **overrides)`` and
    ``CapsModelConfig.cifar100(...)`` (``configs/resnet_backbone_CIFAR{10,100}.json``).

    Attributes
    ----------
    n_classes : int
        Class capsules (default 10).
    in_channels : int
        Image channels (default 3).
    image_size : int
        Side of the square input images (default 32).
    backbone : str
        ``"resnet"`` (default) or ``"simple"``.
    backbone_channels : int
        Backbone output channels, the primary capsules' input (default 128).
    backbone_stride : int
        Stride of the first block of the 2nd resnet stage / of the simple conv (default 2).
    backbone_kernel : int
        Kernel side of the simple backbone's conv, simple backbone only (default 3).
    backbone_padding : int
        Its padding, simple backbone only (default 1).
    resnet_stem : int
        Channels of the resnet stem and first stage (default 64).
    resnet_blocks : tuple of int
        BasicBlocks in the two resnet stages (default ``(3, 4)``).
    primary_types : int
        Primary capsule types (default 32).
    pose_dim : int
        ``d = s*s``, a square: 4x4 matrix poses for CIFAR-10 (default 16), 6x6 for CIFAR-100.
    capsules : tuple of CapsLayerSpec
        The capsule layers before the class capsules (default: CONV 32 types k3 s2, then CONV 32 types k3 s1).
    iterations : int
        ``T >= 1`` (default 2; official CLI default 1; its README recommends > 1).
    sequential_routing : bool
        ``False`` (default): concurrent (Jacobi) schedule, the official default; ``True``: sequential.
    dropout : float
        ``--dp``, on the vote sum before each LayerNorm (default 0.0).
    expansion : str
        ``"unfold"`` (default) or ``"official_bug"``: the official CONV window expansion (apple PR #1).
    norm_eps : float
        LayerNorm epsilon (default 1e-5).
    input_mean : tuple of float or None
        Per-channel input normalisation inside the model (images in [0, 1] in, ``(x - mean) / std`` to the
        backbone); ``None`` (default) = none. The CIFAR recipes set the official statistics (``CIFAR10_MEAN``).
    input_std : tuple of float or None
        The ``std`` of that normalisation (``CIFAR10_STD``); set both or neither (default ``None``).
    stem_side : int or None
        The side an :class:`~capsule_lib.layers.ImageStem` brings the (normalised) images to before the backbone,
        everything after it built for that side (``stem_side=32``: the CIFAR-10 network's capsule grids whatever
        the images' ``image_size``); ``None`` (default): no stem.
    """

    n_classes: int = 10
    in_channels: int = 3
    image_size: int = 32
    backbone: str = "resnet"
    backbone_channels: int = 128
    backbone_stride: int = 2
    backbone_kernel: int = 3
    backbone_padding: int = 1
    resnet_stem: int = 64
    resnet_blocks: tuple[int, int] = (3, 4)
    primary_types: int = 32
    pose_dim: int = 16
    capsules: tuple[CapsLayerSpec, ...] = (CapsLayerSpec("conv", 32, 3, 2), CapsLayerSpec("conv", 32, 3, 1))
    iterations: int = 2
    sequential_routing: bool = False
    dropout: float = 0.0
    expansion: str = "unfold"
    norm_eps: float = 1e-5
    input_mean: tuple[float, ...] | None = None
    input_std: tuple[float, ...] | None = None
    stem_side: int | None = None

    def __post_init__(self) -> None:  # configs read back from JSON (histories, the registry) hold lists/dicts
        check_fields(self, skip=("capsules",))  # every field of the annotated type (one line naming it)
        if not isinstance(self.capsules, (list, tuple)) or not all(
            isinstance(c, (dict, CapsLayerSpec)) for c in self.capsules
        ):
            raise ValueError(f"CapsModelConfig: capsules must be a list of CapsLayerSpec, got {self.capsules!r:.80}")
        self.capsules = tuple(c if isinstance(c, CapsLayerSpec) else CapsLayerSpec(**c) for c in self.capsules)
        self.resnet_blocks = tuple(self.resnet_blocks)
        for name in ("input_mean", "input_std"):
            v = getattr(self, name)
            if v is not None:
                v = tuple(float(t) for t in v)
                if len(v) != self.in_channels:
                    raise ValueError(f"{name} needs one value per input channel ({self.in_channels}), got {v}")
                setattr(self, name, v)
        if (self.input_mean is None) != (self.input_std is None):
            raise ValueError("input_mean and input_std go together: set both or neither")

    @classmethod
    @checked
    def cifar10(cls, backbone: str = "resnet", **overrides) -> CapsModelConfig:
        """CIFAR-10: 2 CONV capsule layers (32 types, k3 s2 then k3 s1), d = 16, 10 class capsules.
        ``backbone``: ``"resnet"`` (default) or ``"simple"``; ``overrides`` change its fields."""
        return cls(
            **{
                "n_classes": 10,
                "backbone": backbone,
                "pose_dim": 16,
                "capsules": (CapsLayerSpec("conv", 32, 3, 2), CapsLayerSpec("conv", 32, 3, 1)),
                **overrides,
            }
        )

    @classmethod
    def cifar100(cls, backbone: str = "resnet", **overrides) -> CapsModelConfig:
        """CIFAR-100: the same CONV layers with d = 36, an FC layer (800 -> 20), then 100 class capsules.
        ``backbone`` and ``overrides`` as in :meth:`cifar10`."""
        return cls(
            **{
                "n_classes": 100,
                "backbone": backbone,
                "pose_dim": 36,
                "capsules": (CapsLayerSpec("conv", 32, 3, 2), CapsLayerSpec("conv", 32, 3, 1), CapsLayerSpec("fc", 20)),
                **overrides,
            }
        )

    @classmethod
    @checked
    def cifar10_cpu(cls, **overrides) -> CapsModelConfig:
        """The chapter's **CPU-sized** CIFAR-10 variant of the same architecture (every change is a size):
        resnet backbone with a 32-channel stem, one BasicBlock per stage and 64 output channels (instead of 64,
        3 + 4 blocks, 128); 8 capsule types in the primary and both CONV capsule layers (instead of 32), same
        kernels, strides, 4x4 poses, class capsules, T = 2, concurrent schedule; CIFAR normalisation inside.
        135,985 parameters; its first CONV capsule layer forms 16x fewer vote values per image than the paper's
        (0.45 M instead of 7.2 M). ``overrides`` change its fields."""
        return cls.cifar10(
            **{
                "backbone": "resnet",
                "resnet_stem": 32,
                "resnet_blocks": (1, 1),
                "backbone_channels": 64,
                "primary_types": 8,
                "capsules": (CapsLayerSpec("conv", 8, 3, 2), CapsLayerSpec("conv", 8, 3, 1)),
                "input_mean": CIFAR10_MEAN,
                "input_std": CIFAR10_STD,
                **overrides,
            }
        )

    @property
    def backbone_grid(self) -> int:
        """Side of the backbone's output grid (16 for 32x32 inputs)."""
        side = self.stem_side or self.image_size  # what the backbone reads
        if self.backbone == "resnet":
            return (side + 2 - 3) // self.backbone_stride + 1
        return (side + 2 * self.backbone_padding - self.backbone_kernel) // self.backbone_stride + 1


# ----------------------------------------------------------------------------------------------- model
class CapsModel(nn.Module):
    """Backbone -> primary capsules -> capsule layers -> class capsules -> shared ``final_fc`` logits.

    ``forward(x, return_routing=False) -> CapsuleOutput`` (see :meth:`forward`).

    Initialisation follows the official code: capsule weights Gaussian (std ``sqrt(M/(s N))`` FC,
    ``sqrt(M/(s N k^2))`` CONV), LayerNorms gamma 1 / beta 0, everything else PyTorch defaults.

    Parameters
    ----------
    config : CapsModelConfig, optional
        The hyper-parameters; ``None`` (default) for ``CapsModelConfig()``, the official CIFAR-10 resnet model.
    overrides
        Keyword arguments: fields of the config to replace.
    """

    @checked
    def __init__(self, config: CapsModelConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = replace(config or CapsModelConfig(), **overrides)  # re-validated (configs set field by field too)
        check_iterations(cfg.iterations)
        check_choice(cfg.expansion, EXPANSIONS, "expansion")
        s = math.isqrt(cfg.pose_dim)
        if s * s != cfg.pose_dim:
            raise ValueError(f"pose_dim must be a square (matrix poses), got {cfg.pose_dim}")
        self.config = cfg
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        self.backbone = build_backbone(cfg, self.image_stem.out_channels)
        self.primary = InvertedPrimaryCapsules(cfg.backbone_channels, cfg.primary_types, cfg.pose_dim, cfg.norm_eps)

        d = cfg.pose_dim
        layers: list[nn.Module] = []
        n_prev, grid = cfg.primary_types, cfg.backbone_grid  # grid is None once the capsules are flat
        for spec in cfg.capsules:
            if spec.kind == "conv":
                if grid is None:
                    raise ValueError("a CONV capsule layer cannot follow an FC capsule layer")
                layer = InvertedConvCapsules(
                    n_prev,
                    spec.n_caps,
                    d,
                    spec.kernel_size,
                    spec.stride,
                    dropout=cfg.dropout,
                    expansion=cfg.expansion,
                    eps=cfg.norm_eps,
                )
                grid = layer.output_size(grid)
                if grid < 1:
                    what = "image_size" if cfg.stem_side is None else "stem_side"
                    raise ValueError(
                        f"{what} {cfg.stem_side or cfg.image_size} is too small for the CONV capsule layers"
                    )
                n_prev = spec.n_caps
            elif spec.kind == "fc":
                n_inp = n_prev * grid * grid if grid is not None else n_prev
                layer = InvertedFCCapsules(
                    n_inp, spec.n_caps, d, iterations=cfg.iterations, dropout=cfg.dropout, eps=cfg.norm_eps
                )
                n_prev, grid = spec.n_caps, None
            else:
                raise ValueError(f"capsule layer kind must be 'conv' or 'fc', got {spec.kind!r}")
            layers.append(layer)
        n_inp = n_prev * grid * grid if grid is not None else n_prev
        layers.append(
            InvertedFCCapsules(
                n_inp, cfg.n_classes, d, iterations=cfg.iterations, dropout=cfg.dropout, eps=cfg.norm_eps
            )
        )
        self.capsule_layers = nn.ModuleList(layers)
        self.final_fc = nn.Linear(d, 1)  # shared by all classes
        _register_input_norm(self, cfg)

    @property
    def class_capsules(self) -> InvertedFCCapsules:
        return self.capsule_layers[-1]

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (see ``_input_contract``)."""
        return _input_contract(self.config)

    def primary_capsules(self, x: torch.Tensor) -> torch.Tensor:
        """The post-LayerNorm primary poses ``P_0`` of images.

        Parameters
        ----------
        x : torch.Tensor
            As in :meth:`forward`; the normalisation happens here.

        Returns
        -------
        torch.Tensor
            ``[B, primary_types, h, w, d]`` (``[B, 32, 16, 16, 16]`` by default).
        """
        check_images(x, self.input_contract)
        return self.primary(self.backbone(self.image_stem(_normalise(self, x))))

    def route(
        self,
        p0: torch.Tensor,
        return_routing: bool = False,
        iterations: int | None = None,
        sequential: bool | None = None,
    ):
        """Run the routing schedule from the primary poses ``p0``.

        With ``L_l(P_in, P_prev)`` one update of capsule layer ``l`` and ``T = iterations``:

        * concurrent (default): ``P_l^(1) = L_l(P_{l-1}^(1))`` (uniform feed-forward pass), then for
          ``t = 2..T`` every layer updates from the *previous iteration's* values (Jacobi):
          ``P_l^(t) = L_l(P_{l-1}^(t-1), P_l^(t-1))``; ``P_0`` stays fixed;
        * sequential: layer by layer, ``P_l <- L_l(P_{l-1})`` then ``T-1`` times ``P_l <- L_l(P_{l-1}, P_l)``
          with the final ``P_{l-1}``.

        Both schedules coincide for ``T = 1``.

        Parameters
        ----------
        p0 : torch.Tensor
            ``[B, primary_types, h, w, d]`` primary poses (:meth:`primary_capsules`).
        return_routing : bool, optional
            Also return the traces (default ``False``).
        iterations : int, optional
            ``T`` for this call, >= 1 (e.g. to evaluate a trained model with another T); ``None`` (default) uses the
            config's ``iterations``.
        sequential : bool, optional
            The schedule for this call; ``None`` (default) uses the config's ``sequential_routing``.

        Returns
        -------
        list of torch.Tensor
            The final poses of every level ``[P_0, P_1, ..., P_L]`` (``P_L`` = class capsules ``[B, K, d]``); with
            ``return_routing``, ``(poses, traces)``: one :class:`~capsule_lib.types.RoutingTrace` per capsule layer
            (one entry per update of that layer).
        """
        layers = self.capsule_layers
        T = self.config.iterations if iterations is None else check_iterations(iterations)
        seq = self.config.sequential_routing if sequential is None else bool(sequential)
        traces = [RoutingTrace("inverted") for _ in layers] if return_routing else None

        def update(idx: int, p_in: torch.Tensor, p_prev: torch.Tensor | None) -> torch.Tensor:
            if traces is None:
                return layers[idx](p_in, p_prev)
            out, tr = layers[idx](p_in, p_prev, return_routing=True)
            traces[idx].coefficients += tr.coefficients
            traces[idx].agreements += tr.agreements
            traces[idx].outputs += tr.outputs
            return out

        if not seq:
            values = [p0]
            for idx in range(len(layers)):  # iteration 1: uniform feed-forward pass
                values.append(update(idx, values[idx], None))
            for _ in range(T - 1):  # iterations 2..T: all layers in parallel from the previous iteration
                values = [p0] + [update(idx, values[idx], values[idx + 1]) for idx in range(len(layers))]
        else:
            values = [p0]
            for idx in range(len(layers)):
                v = update(idx, values[idx], None)
                for _ in range(T - 1):
                    v = update(idx, values[idx], v)
                values.append(v)
        if traces is not None:
            return values, traces
        return values

    def forward(
        self,
        x: torch.Tensor,
        return_routing: bool = False,
        iterations: int | None = None,
        sequential: bool | None = None,
    ) -> CapsuleOutput:
        """Images -> class capsules and logits.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1] (normalised inside when the config says
            so).
        return_routing : bool, optional
            Also record the traces (default ``False``).
        iterations : int, optional
            ``T`` for this call, >= 1; ``None`` (default) uses the config's (see :meth:`route`).
        sequential : bool, optional
            The schedule for this call; ``None`` (default) uses the config's ``sequential_routing``.

        Returns
        -------
        CapsuleOutput
            ``scores [B, K]``: the **logits** ``w . p_k + b`` of the shared ``final_fc`` (``kind="logits"``, not
            capsule lengths; train with cross-entropy on them, as the paper does); ``poses [B, K, d]``: the class
            capsules after the last update; ``trace`` (``return_routing=True``): the class layer's
            :class:`~capsule_lib.types.RoutingTrace`, one entry per update of that layer (``T`` entries, the last
            is the final update; coefficients ``[B, n_inp, K]``), with ``extra["layers"]`` the traces of the other
            capsule layers in order (CONV coefficients ``[B, h, w, N*k*k, M]``), ``extra["poses"]`` the final poses
            of every level ``[P_0, ..., P_L]`` and ``extra["schedule"]``.
        """
        check_model_input(x, self)
        p0 = self.primary_capsules(x)  # [B, 32, 16, 16, d]
        seq = self.config.sequential_routing if sequential is None else bool(sequential)
        if return_routing:
            values, traces = self.route(p0, True, iterations, seq)
        else:
            values, traces = self.route(p0, False, iterations, seq), None
        poses = values[-1]  # [B, K, d]
        logits = self.final_fc(poses).squeeze(-1)  # [B, K] (also for B = 1)
        trace = None
        if traces is not None:
            trace = traces[-1]
            trace.extra.update(
                layers=traces[:-1],
                poses=values,
                schedule="sequential" if seq else "concurrent",
            )
        return CapsuleOutput(scores=logits, kind="logits", poses=poses, reconstruction=None, trace=trace)

    def parameter_breakdown(self) -> dict[str, int]:
        """Parameters per part.

        Returns
        -------
        dict[str, int]
            ``backbone``, ``primary capsules``, ``capsule layers`` (all of them, the class layer included),
            ``final_fc``, plus ``"total"``.
        """
        count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        parts = {
            "backbone": count(self.backbone),
            "primary capsules": count(self.primary),
            "capsule layers": sum(count(layer) for layer in self.capsule_layers),
            "final_fc": count(self.final_fc),
        }
        return {**parts, "total": sum(parts.values())}

    def set_expansion(self, expansion: str) -> CapsModel:
        """Switch how every CONV capsule layer gathers its windows; the weights are unchanged.

        Parameters
        ----------
        expansion : str
            ``"unfold"``, or ``"official_bug"`` to reproduce the official ``input_expansion``.

        Returns
        -------
        CapsModel
            ``self`` (its config's ``expansion`` updated).
        """
        check_choice(expansion, EXPANSIONS, "expansion")
        for layer in self.capsule_layers:
            if isinstance(layer, InvertedConvCapsules):
                layer.expansion = expansion
        self.config = replace(self.config, expansion=expansion)
        return self

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"backbone={c.backbone!r}, n_classes={c.n_classes}, pose_dim={c.pose_dim}, "
            f"iterations={c.iterations}, sequential_routing={c.sequential_routing}, "
            f"expansion={c.expansion!r}"
        )


# ------------------------------------------------------------------------------------------- baseline
class BackboneClassifier(nn.Module):
    """The capsule model's backbone with a linear head instead of the capsule layers: backbone ->
    global average pooling -> ``Linear(backbone_channels, n_classes)``. Built from the same
    :class:`CapsModelConfig` (only the backbone fields and the input normalisation are used), so the
    comparison isolates what the capsule layers add.

    Parameters
    ----------
    config, overrides
        As in :class:`CapsModel`.
    """

    def __init__(self, config: CapsModelConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = replace(config or CapsModelConfig(), **overrides)  # re-validated (configs set field by field too)
        self.config = cfg
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        self.backbone = build_backbone(cfg, self.image_stem.out_channels)
        self.head = nn.Linear(cfg.backbone_channels, cfg.n_classes)
        _register_input_norm(self, cfg)

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (see ``_input_contract``)."""
        return _input_contract(self.config)

    def forward(self, x: torch.Tensor) -> CapsuleOutput:
        """Classify images.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1], normalised inside as in :class:`CapsModel`.

        Returns
        -------
        CapsuleOutput
            ``scores`` = logits ``[B, n_classes]`` (``kind="logits"``); no poses, reconstruction or trace.
        """
        check_model_input(x, self)
        feats = self.backbone(self.image_stem(_normalise(self, x))).mean(dim=(2, 3))  # [B, C]
        return CapsuleOutput(scores=self.head(feats), kind="logits", poses=None, reconstruction=None, trace=None)
