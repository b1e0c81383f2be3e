"""Matrix capsules with EM routing (Hinton, Sabour & Frosst, ICLR 2018): the smallNORB network.

Shapes for the default configuration (A=64, B=8, C=D=16, 32x32 input, valid convolutions)::

    x             [B, 1, 32, 32]        smallNORB crop (in_channels=2 to feed both stereo images)
    conv1         [B, 64, 14, 14]       5x5 stride 2, ReLU (BatchNorm optional)
    primary caps  [B, 8, 14, 14, 16]    1x1 conv: 4x4 pose + sigmoid activation per type
    conv caps 1   [B, 16, 6, 6, 16]     K=3, stride 2, EM routing per 3x3x8 window
    conv caps 2   [B, 16, 4, 4, 16]     K=3, stride 1, EM routing per 3x3x16 window
    class caps    [B, 5, 16]            weights shared over positions, coordinate addition, EM routing
    lengths       [B, 5]                class ACTIVATIONS a_j in (0, 1), trained with spread loss

Parameters of the default model (``EMCapsNet.parameter_breakdown()``; in_channels=1, no BatchNorm)::

    conv1         1*64*5*5 + 64                   =  1,664
    primary caps  64*8*(16+1) + 8*(16+1)          =  8,840
    conv caps 1   3*3*8*16*16 + 2*16 (betas)      = 18,464
    conv caps 2   3*3*16*16*16 + 2*16             = 36,896
    class caps    16*5*16 + 2*5                   =  1,290
    total                                         = 67,154   (68,754 with in_channels=2)

The paper's smaller model (A=64, B=8, C=D=16) is quoted at about 68K parameters [recalled, unverified];
its main model (``EMCapsNetConfig.large()``, A=B=C=D=32) at 310K, where ours has 316,394 (1 input
channel): the difference is within what unknown details (biases, betas per type or per layer, input
channels) explain. We do not force either number.

Choices (routing choices are documented in :mod:`capsule_lib.routing.em`): valid convolutions (32 -> 14 -> 6
-> 4, the grid sizes of the paper's figure; yl-1993 pads conv1 by 2 for 28x28 MNIST); no BatchNorm by
default (``batch_norm=True`` adds yl-1993's); 3 EM iterations (paper; yl-1993 and IBM default to 2);
coordinate addition with the true receptive-field centres of the ConvCaps2 positions in the image, scaled
to (0, 1) (``receptive_field_centers``); capsule transformations ~ N(0, 1/4) (variance-preserving for a
4x4 product; the paper's truncated-normal stds are not published).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_model_input, resolve_config
from .._contracts import check_fields, checked
from ..layers import ClassCapsules, ConvCapsules, MatrixPrimaryCapsules
from ..layers.matrix import grid_centers
from ..routing.em import em_routing, inverse_temperature_schedule
from ..types import CapsuleOutput, ImageContract

__all__ = ["EMCapsNetConfig", "EMCapsNet", "receptive_field_centers", "class_centers"]


@dataclass
class EMCapsNetConfig:
    """EM capsule network hyper-parameters; defaults are the paper's smaller smallNORB model.

    Paper letters: ``conv_channels`` = A, ``primary_types`` = B, ``caps1_types`` = C, ``caps2_types`` = D.
    Routing options are passed to every capsule layer (see :func:`capsule_lib.routing.em.em_routing`).

    Attributes
    ----------
    in_channels : int
        Image channels: 1 (default; one image of the smallNORB stereo pair, the common choice) or 2 for both.
    image_size : int
        Side of the square input images (default 32).
    conv_channels : int
        A: channels of conv1 (default 64).
    conv_kernel : int
        Kernel side of conv1 (default 5).
    conv_stride : int
        Stride of conv1 (default 2).
    conv_padding : int
        Padding of conv1 (default 0, valid: 32 -> 14 -> 6 -> 4; yl-1993 pads 2 for 28x28 MNIST).
    batch_norm : bool
        BatchNorm after conv1 (default ``False``: the paper has none; yl-1993 uses ``BatchNorm2d(eps=1e-3)``).
    primary_types : int
        B: primary capsule types (default 8).
    caps1_types : int
        C: ConvCaps1 types (default 16).
    caps2_types : int
        D: ConvCaps2 types (default 16).
    caps_kernel : int
        Kernel side of both convolutional capsule layers (default 3).
    caps1_stride : int
        ConvCaps1 stride (default 2).
    caps2_stride : int
        ConvCaps2 stride (default 1).
    n_classes : int
        Class capsules (default 5).
    pose_size : int
        Poses are ``P x P`` matrices (default 4).
    iterations : int
        EM iterations of every capsule layer, >= 1 (default 3).
    final_lambda : float
        Scale of the inverse-temperature schedule, for ``normalize_costs=True`` (default 1.0; see
        :func:`~capsule_lib.routing.em.inverse_temperature_schedule`).
    lambda_schedule : str
        Its shape: ``"hinton"`` (default), ``"fixed"`` or ``"linear"``.
    normalize_costs : bool
        Normalise the costs by ``n_out / n_inp`` (default ``True``; see :func:`~capsule_lib.routing.em.em_routing`).
    normalize_over_outputs : bool
        yl-1993 quirk (cancels ``a_in``), for comparison only (default ``False``).
    coord_add : bool
        Coordinate addition in the class capsules (default ``True``).
    coord_centers : str
        Where coordinate addition puts each ConvCaps2 position: ``"receptive_field"`` (default; the centre of its
        receptive field in the image, ``(pixel + 0.5) / image_size``), ``"grid"`` (its cell centre on the 4x4 grid,
        ``(y + 0.5) / h``) or ``"grid_corner"`` (``y / h``, yl-1993's convention).
    eps : float
        Variance floor and guard of the EM routing's denominators (default 1e-8).
    init_std : float or None
        Capsule transformation std; ``None`` (default) = ``1/sqrt(pose_size)`` (variance-preserving).
    """

    in_channels: int = 1
    image_size: int = 32
    conv_channels: int = 64
    conv_kernel: int = 5
    conv_stride: int = 2
    conv_padding: int = 0
    batch_norm: bool = False
    primary_types: int = 8
    caps1_types: int = 16
    caps2_types: int = 16
    caps_kernel: int = 3
    caps1_stride: int = 2
    caps2_stride: int = 1
    n_classes: int = 5
    pose_size: int = 4
    iterations: int = 3
    final_lambda: float = 1.0
    lambda_schedule: str = "hinton"
    normalize_costs: bool = True
    normalize_over_outputs: bool = False
    coord_add: bool = True
    coord_centers: str = "receptive_field"
    eps: float = 1e-8
    init_std: float | None = None

    @classmethod
    def small(cls, **overrides) -> EMCapsNetConfig:
        """MNIST-sized, fast variant: 1x28x28, A=32, B=C=D=8, 10 classes (28 -> 12 -> 5 -> 3 grids).
        ``overrides`` change its fields."""
        base = cls(
            in_channels=1, image_size=28, conv_channels=32, primary_types=8, caps1_types=8, caps2_types=8, n_classes=10
        )
        return replace(base, **overrides)

    @classmethod
    @checked
    def large(cls, **overrides) -> EMCapsNetConfig:
        """The paper's main smallNORB model, A=B=C=D=32 (quoted at 310K parameters). ``overrides`` change its fields."""
        return replace(cls(conv_channels=32, primary_types=32, caps1_types=32, caps2_types=32), **overrides)

    @staticmethod
    def _out(size: int, kernel: int, stride: int, padding: int = 0) -> int:
        return (size + 2 * padding - kernel) // stride + 1

    @property
    def conv_grid(self) -> int:
        return self._out(self.image_size, self.conv_kernel, self.conv_stride, self.conv_padding)

    @property
    def caps1_grid(self) -> int:
        return self._out(self.conv_grid, self.caps_kernel, self.caps1_stride)

    @property
    def caps2_grid(self) -> int:
        return self._out(self.caps1_grid, self.caps_kernel, self.caps2_stride)

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


def receptive_field_centers(cfg: EMCapsNetConfig) -> torch.Tensor:
    """Centres of the receptive fields of the ConvCaps2 positions in the input image, scaled to ``(0, 1)``
    as ``(pixel + 0.5) / image_size``: ``[h, w, 2]`` (row, column) for coordinate addition.

    Each layer ``(kernel k, stride s, padding p)`` maps an output index ``o`` to the input centre
    ``s*o + (k-1)/2 - p``; the maps are composed from ConvCaps2 back to the image.

    Parameters
    ----------
    cfg : EMCapsNetConfig
        The network's configuration.

    Returns
    -------
    torch.Tensor
        ``[h, w, 2]`` (row, column) float32 coordinates in ``(0, 1)``, ``h = w = cfg.caps2_grid``.
    """
    layers = [
        (cfg.conv_kernel, cfg.conv_stride, cfg.conv_padding),
        (1, 1, 0),
        (cfg.caps_kernel, cfg.caps1_stride, 0),
        (cfg.caps_kernel, cfg.caps2_stride, 0),
    ]
    pos = torch.arange(cfg.caps2_grid, dtype=torch.float64)  # [h]
    for k, s, p in reversed(layers):
        pos = s * pos + (k - 1) / 2 - p
    c = ((pos + 0.5) / cfg.image_size).float()  # [h]
    return torch.stack(torch.meshgrid(c, c, indexing="ij"), dim=-1)  # [h, w, 2]


def class_centers(cfg: EMCapsNetConfig) -> torch.Tensor:
    """The coordinates coordinate addition adds for each ConvCaps2 position.

    Parameters
    ----------
    cfg : EMCapsNetConfig
        The network's configuration; ``cfg.coord_centers`` chooses the coordinates (another value raises
        ``ValueError``).

    Returns
    -------
    torch.Tensor
        ``[h, w, 2]`` (row, column) coordinates, ``h = w = cfg.caps2_grid``.
    """
    if cfg.coord_centers == "receptive_field":
        return receptive_field_centers(cfg)
    if cfg.coord_centers in ("grid", "grid_corner"):
        convention = "center" if cfg.coord_centers == "grid" else "corner"
        return grid_centers(cfg.caps2_grid, cfg.caps2_grid, convention=convention)
    raise ValueError(f"coord_centers must be 'receptive_field', 'grid' or 'grid_corner', got {cfg.coord_centers!r}")


class EMCapsNet(nn.Module):
    """Conv1 -> PrimaryCaps -> ConvCaps1 -> ConvCaps2 -> ClassCaps (EM routing, coordinate addition).

    ``forward(x, return_routing=False) -> CapsuleOutput`` with ``lengths [B, K]`` = the class capsules'
    **activations** (in (0, 1); not vector lengths, no reconstruction): use them with
    :func:`capsule_lib.losses.spread_loss`. ``poses [B, K, 16]`` are the class pose matrices (flattened).
    With ``return_routing=True``, ``trace`` is the class layer's :class:`RoutingTrace` and
    ``extra["traces"]`` holds ``{"conv_caps1": ..., "conv_caps2": ..., "class_caps": ...}``.
    ``extra["activations"]`` always holds each capsule layer's activations (grids ``[B, T, h, w]``).

    Parameters
    ----------
    config : EMCapsNetConfig, optional
        The hyper-parameters; ``None`` (default) for ``EMCapsNetConfig()``, the paper's smaller smallNORB model.
    overrides
        Config fields to replace, as keyword arguments (e.g. ``iterations=2``).
    """

    @checked
    def __init__(self, config: EMCapsNetConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, EMCapsNetConfig, overrides)
        if cfg.caps2_grid < 1:
            raise ValueError(f"image_size {cfg.image_size} is too small for the conv/capsule stack")
        self.config = cfg
        routing = dict(
            iterations=cfg.iterations,
            inverse_temperature=partial(
                inverse_temperature_schedule, final_lambda=cfg.final_lambda, kind=cfg.lambda_schedule
            ),
            normalize_over_outputs=cfg.normalize_over_outputs,
            normalize_costs=cfg.normalize_costs,
            eps=cfg.eps,
            init_std=cfg.init_std,
        )
        P, K = cfg.pose_size, cfg.caps_kernel
        self.conv1 = nn.Conv2d(cfg.in_channels, cfg.conv_channels, cfg.conv_kernel, cfg.conv_stride, cfg.conv_padding)
        self.bn1 = nn.BatchNorm2d(cfg.conv_channels, eps=1e-3) if cfg.batch_norm else None
        self.primary_caps = MatrixPrimaryCapsules(cfg.conv_channels, cfg.primary_types, P)
        self.conv_caps1 = ConvCapsules(cfg.primary_types, cfg.caps1_types, K, cfg.caps1_stride, 0, P, **routing)
        self.conv_caps2 = ConvCapsules(cfg.caps1_types, cfg.caps2_types, K, cfg.caps2_stride, 0, P, **routing)
        self.class_caps = ClassCapsules(cfg.caps2_types, cfg.n_classes, P, coord_add=cfg.coord_add, **routing)
        self.register_buffer("centers", class_centers(cfg), persistent=False)  # [h, w, 2]

    def parameter_breakdown(self) -> dict[str, int]:
        """Trainable parameters per top-level layer, plus ``"total"``.

        Returns
        -------
        dict[str, int]
            Layer name (``"conv1"``, ``"primary_caps"``, ...) -> parameters, for the layers that have any.
        """
        counts: dict[str, int] = {}
        for name, module in self.named_children():
            n = sum(p.numel() for p in module.parameters() if p.requires_grad)
            if n:
                counts[name] = n
        counts["total"] = sum(counts.values())
        return counts

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """Conv1 (+ BatchNorm) + ReLU: the features the primary capsules read.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` images (not checked here, unlike in :meth:`forward`).

        Returns
        -------
        torch.Tensor
            ``[B, A, h, w]`` features (``[B, 64, 14, 14]`` by default).
        """
        h = self.conv1(x)  # [B, A, 14, 14]
        if self.bn1 is not None:
            h = self.bn1(h)
        return F.relu(h)

    def class_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The class layer's children for images ``x`` (everything below the class capsules, run once).

        Parameters
        ----------
        x : torch.Tensor
            Images, checked as in :meth:`forward`.

        Returns
        -------
        poses : torch.Tensor
            ``[B, D, h, w, 16]`` ConvCaps2 poses.
        activations : torch.Tensor
            ``[B, D, h, w]`` ConvCaps2 activations.
        """
        check_model_input(x, self)
        p0, a0 = self.primary_caps(self.stem(x))
        p1, a1 = self.conv_caps1(p0, a0)
        return self.conv_caps2(p1, a1)

    def route_classes(
        self,
        poses: torch.Tensor,
        acts: torch.Tensor,
        iterations: int | None = None,
        final_lambda: float | None = None,
    ):
        """Route the class capsules from given children (:meth:`class_inputs`) with another number of
        ``iterations`` and/or inverse-temperature scale ``final_lambda`` than the model was built with (same
        schedule shape, same weights). With neither argument it equals the model's own class layer.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, D, h, w, 16]`` ConvCaps2 poses.
        acts : torch.Tensor
            ``[B, D, h, w]`` ConvCaps2 activations.
        iterations : int, optional
            EM iterations, >= 1; ``None`` (default) uses the class layer's.
        final_lambda : float, optional
            Inverse-temperature scale; ``None`` (default) uses the config's.

        Returns
        -------
        tuple
            ``((poses [B, K, 16], activations [B, K]), trace)``, ``trace`` the
            :class:`~capsule_lib.types.RoutingTrace` of :func:`~capsule_lib.routing.em.em_routing`.
        """
        c, caps = self.config, self.class_caps
        T = iterations if iterations is not None else caps.iterations
        lam = final_lambda if final_lambda is not None else c.final_lambda
        votes, a = caps.votes(poses, acts, self.centers)
        return em_routing(
            votes,
            a,
            caps.beta_u,
            caps.beta_a,
            T,
            inverse_temperature=inverse_temperature_schedule(T, lam, c.lambda_schedule),
            normalize_over_outputs=caps.normalize_over_outputs,
            normalize_costs=caps.normalize_costs,
            eps=caps.eps,
            return_routing=True,
        )

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def forward(self, x: torch.Tensor, return_routing: bool = False, iterations: int | None = None) -> CapsuleOutput:
        """Images -> class capsules.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1] (``[B, 1, 32, 32]`` by default).
        return_routing : bool, optional
            Also record every layer's routing trace (default ``False``).
        iterations : int, optional
            EM iterations of every layer for this call, >= 1 (each derives its inverse temperatures for that
            number, :meth:`~capsule_lib.routing.em.EMRoutingBase.inverse_temperatures`); ``None`` (default) uses
            the config's.

        Returns
        -------
        CapsuleOutput
            ``scores`` = class activations ``[B, K]`` (``kind="activations"``), ``poses [B, K, 16]``, no
            reconstruction; ``trace`` and ``extra`` as in the class docstring.
        """
        check_model_input(x, self)
        p0, a0 = self.primary_caps(self.stem(x))  # [B, B_, 14, 14, 16], [B, B_, 14, 14]
        traces, T = {}, {} if iterations is None else {"iterations": iterations}
        if return_routing:
            (p1, a1), traces["conv_caps1"] = self.conv_caps1(p0, a0, return_routing=True, **T)
            (p2, a2), traces["conv_caps2"] = self.conv_caps2(p1, a1, return_routing=True, **T)
            (poses, acts), traces["class_caps"] = self.class_caps(p2, a2, self.centers, return_routing=True, **T)
        else:
            p1, a1 = self.conv_caps1(p0, a0, **T)  # [B, C, 6, 6, 16], [B, C, 6, 6]
            p2, a2 = self.conv_caps2(p1, a1, **T)  # [B, D, 4, 4, 16], [B, D, 4, 4]
            poses, acts = self.class_caps(p2, a2, self.centers, **T)  # [B, K, 16], [B, K]
        extra = {"activations": {"primary_caps": a0, "conv_caps1": a1, "conv_caps2": a2}}
        if return_routing:
            extra["traces"] = traces
        return CapsuleOutput(acts, "activations", poses, None, traces.get("class_caps"), extra)
