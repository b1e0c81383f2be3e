"""Efficient-CapsNet of Mazzia, Salvetti & Chiaberge (2021), "Efficient-CapsNet: capsule network with
self-attention routing" (Sci. Rep. 11:14634; official TF2 code EscVM/Efficient-CapsNet).

Shapes for the MNIST configuration (the default, :meth:`EfficientCapsNetConfig.mnist`)::

    x             [B, 1, 28, 28]
    conv 5x5      [B, 32, 24, 24]    each conv: conv -> ReLU -> BatchNorm (the official order)
    conv 3x3      [B, 64, 22, 22]
    conv 3x3      [B, 64, 20, 20]
    conv 3x3 s2   [B, 128, 9, 9]
    primary       [B, 16, 8]         depthwise 9x9 conv (groups=128) -> 1x1x128 -> 16 capsules of 8, squash_E
    FCCaps        [B, 10, 16]        self-attention routing (one pass)
    lengths       [B, 10]            sqrt(sum v^2 + 1e-7)
    decoder       [B, 1, 28, 28]     FC 160-512-1024-784, sigmoid; masked by the label (train) or the longest

MultiMNIST (36x36): the third conv has stride 2 (36 -> 32 -> 30 -> 14 -> 6), primary kernel 5 with stride 2
(-> 1x1), FC decoder to 36*36; at test time the two longest capsules are kept (``mask_k=2``) and, as in the
official code, each of them is also decoded separately (``out.extra["reconstructions"] [B, 2, 1, 36, 36]``).

smallNORB (48x48x2): conv 7x7 s2 / 3 / 3 / 3 s2 (48 -> 21 -> 19 -> 17 -> 8), each conv -> LeakyReLU (Keras
default slope 0.3) -> InstanceNorm with affine gamma/beta (tfa; both initialised U(-0.05, 0.05), eps 1e-3);
primary kernel 8 -> 1x1; FCCaps(5, 16); decoder Dense 64 -> 8x8x1 -> 3 x [bilinear x2, conv 3x3 valid,
leaky ReLU 0.2] with 64, 128, 128 channels -> conv 3x3 (2, sigmoid) -> [B, 2, 48, 48].

Parameter counts (trainable, **decoder excluded**, as in the paper and in the official
``efficient_capsnet_graph`` Keras model whose ``summary()`` they come from; the decoder is a separate
``Generator`` model): MNIST 161,824 (162,400 with the 576 BatchNorm running statistics), MultiMNIST
154,656, smallNORB 151,664. See :meth:`EfficientCapsNet.num_parameters`.

Notes on fidelity
-----------------
* Input scaling: the official MNIST pipeline divides the uint8 images by **256**; this library's loaders
  divide by 255, a 0.4 % difference in scale that the ReLU (positively homogeneous) and the BatchNorm right
  after the first conv almost entirely absorb (only the first conv's bias is affected, and it is learned).
* Initialisation, ``init="keras"`` (default): the official Keras initialisers -- he_normal (truncated) convs
  with zero bias, glorot_uniform depthwise conv, FCCaps he_normal with Keras's 4-D fan-in (see
  :class:`~capsule_lib.routing.self_attention.SelfAttentionRouting`), decoder he_normal / glorot_normal
  (FC) or glorot_uniform (conv), zero biases, InstanceNorm gamma/beta U(-0.05, 0.05).
  ``init="torch"`` keeps PyTorch's defaults (FCCaps still uses he_normal, with ``fan_in = d_in``).
* BatchNorm uses Keras's ``epsilon=1e-3`` and ``momentum=0.99`` (PyTorch ``momentum=0.01``): the running
  statistics need a few hundred steps to settle, so evaluate very short runs with care.
* The squash epsilon 1e-20 sits inside the norm's root (gradient-safe) rather than outside; the primary
  capsules use :class:`~capsule_lib.layers.DepthwisePrimaryCapsules`'s squash_E (epsilon 1e-8 inside the
  root). Both agree with the official values to float precision for capsules that are not ~0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_images, check_model_input, check_tensor, resolve_config
from .._contracts import check_fields, checked
from ..functional import capsule_lengths
from ..layers import DepthwisePrimaryCapsules, FCDecoder, ImageStem, UpsampleConvDecoder, mask_capsules
from ..routing.self_attention import SQUASH_EPS, SelfAttentionRouting, keras_fans, keras_he_normal_
from ..types import TRUNC_NORMAL_STD, CapsuleOutput, ImageContract

__all__ = ["EfficientCapsNetConfig", "EfficientCapsNet", "EFFICIENT_PRESETS"]


@dataclass
class EfficientCapsNetConfig:
    """Efficient-CapsNet hyper-parameters; the defaults are the paper's MNIST model.

    Presets: :meth:`mnist`, :meth:`multimnist`, :meth:`smallnorb` (or :meth:`preset` by name).

    Attributes
    ----------
    in_channels : int
        Image channels (default 1; 2 for smallNORB's stereo pairs).
    image_size : int
        Side of the square input images (default 28).
    conv_channels : tuple of int
        Output channels of the backbone convolutions (default ``(32, 64, 64, 128)``).
    conv_kernels : tuple of int
        Their kernel sides, valid padding (default ``(5, 3, 3, 3)``).
    conv_strides : tuple of int
        Their strides (default ``(1, 1, 1, 2)``).
    norm : str
        ``"batch"`` (default; MNIST, MultiMNIST) or ``"instance"`` (smallNORB, affine).
    activation : str
        ``"relu"`` (default) or ``"leaky_relu"``; each conv: conv -> activation -> norm.
    leaky_slope : float
        Keras ``LeakyReLU()`` default alpha (smallNORB backbone) (default 0.3).
    norm_eps : float
        Keras ``BatchNormalization`` / tfa ``InstanceNormalization`` epsilon (default 1e-3).
    bn_momentum : float
        BatchNorm momentum, PyTorch convention (default 0.01 = Keras momentum 0.99).
    primary_kernel : int
        Kernel side of the depthwise primary-capsule convolution (default 9).
    primary_stride : int
        Its stride (default 1).
    n_primary_caps : int
        Capsules per position: 16 capsules of 8 from the 128 depthwise channels (default 16).
    primary_dim : int
        Primary capsule dimension (default 8).
    n_classes : int
        Class capsules (default 10).
    class_dim : int
        Class capsule dimension (default 16).
    squash_eps : float
        FCCaps squash_E epsilon (default ``SQUASH_EPS`` = 1e-20; official ``10e-21``).
    length_eps : float
        Length: ``sqrt(sum v^2 + K.epsilon())`` (default 1e-7).
    decoder : str or None
        ``"fc"`` (default; MNIST, MultiMNIST), ``"conv"`` (smallNORB) or ``None``.
    decoder_hidden : tuple of int
        Hidden widths of the FC decoder (default ``(512, 1024)``).
    decoder_slope : float
        ``tf.nn.leaky_relu`` default alpha (conv decoder) (default 0.2).
    mask_k : int
        Capsules kept for reconstruction at test time (default 1; 2 for MultiMNIST).
    decode_separately : bool
        Also decode each kept capsule on its own (MultiMNIST) (default ``False``).
    init : str
        ``"keras"`` (default; the official initialisers) or ``"torch"`` (PyTorch defaults).
    stem_side : int or None
        The side an :class:`~capsule_lib.layers.ImageStem` brings the images to before the backbone; everything
        after it (backbone, primary capsules, decoder) is built for that side, so that images of any
        ``image_size`` meet the paper's network (``stem_side=28``: 16 primary capsules); the decoder
        reconstructs the image as the stem resizes it. ``None`` (default): no stem.
    """

    in_channels: int = 1
    image_size: int = 28
    conv_channels: tuple[int, ...] = (32, 64, 64, 128)
    conv_kernels: tuple[int, ...] = (5, 3, 3, 3)
    conv_strides: tuple[int, ...] = (1, 1, 1, 2)
    norm: str = "batch"
    activation: str = "relu"
    leaky_slope: float = 0.3
    norm_eps: float = 1e-3
    bn_momentum: float = 0.01
    primary_kernel: int = 9
    primary_stride: int = 1
    n_primary_caps: int = 16
    primary_dim: int = 8
    n_classes: int = 10
    class_dim: int = 16
    squash_eps: float = SQUASH_EPS
    length_eps: float = 1e-7
    decoder: str | None = "fc"
    decoder_hidden: tuple[int, ...] = (512, 1024)
    decoder_slope: float = 0.2
    mask_k: int = 1
    decode_separately: bool = False
    init: str = "keras"
    stem_side: int | None = None

    @classmethod
    @checked
    def mnist(cls, **overrides) -> EfficientCapsNetConfig:
        """28x28x1, 161,824 trainable parameters without the decoder. ``overrides`` change its fields."""
        return cls(**overrides)

    @classmethod
    def multimnist(cls, **overrides) -> EfficientCapsNetConfig:
        """36x36x1 (third conv stride 2, primary kernel 5 stride 2), top-2 masking; 154,656 parameters.
        ``overrides`` change its fields."""
        kw = dict(
            image_size=36,
            conv_strides=(1, 1, 2, 2),
            primary_kernel=5,
            primary_stride=2,
            mask_k=2,
            decode_separately=True,
        )
        return cls(**{**kw, **overrides})

    @classmethod
    def smallnorb(cls, **overrides) -> EfficientCapsNetConfig:
        """48x48x2 stereo pairs, LeakyReLU + InstanceNorm backbone, 5 classes, conv decoder; 151,664.
        ``overrides`` change its fields."""
        kw = dict(
            in_channels=2,
            image_size=48,
            conv_kernels=(7, 3, 3, 3),
            conv_strides=(2, 1, 1, 2),
            norm="instance",
            activation="leaky_relu",
            primary_kernel=8,
            n_classes=5,
            decoder="conv",
        )
        return cls(**{**kw, **overrides})

    @classmethod
    def preset(cls, name: str, **overrides) -> EfficientCapsNetConfig:
        """The preset ``name`` (``"mnist"``, ``"multimnist"`` or ``"smallnorb"``, a key of ``EFFICIENT_PRESETS``;
        others raise ``ValueError``), ``overrides`` changing its fields."""
        try:
            return EFFICIENT_PRESETS[name](**overrides)
        except KeyError:
            raise ValueError(f"unknown preset {name!r}; expected one of {sorted(EFFICIENT_PRESETS)}") from None

    def feature_sizes(self) -> list[int]:
        """Spatial size after each backbone conv (valid padding).

        Returns
        -------
        list of int
            One side per convolution (``[24, 22, 20, 9]`` for MNIST).
        """
        sizes, h = [], self.stem_side or self.image_size
        for k, s in zip(self.conv_kernels, self.conv_strides):
            h = (h - k) // s + 1
            sizes.append(h)
        return sizes

    @property
    def primary_grid(self) -> int:
        h = self.feature_sizes()[-1]
        return (h - self.primary_kernel) // self.primary_stride + 1

    @property
    def n_primary(self) -> int:
        """Number of primary capsules ``n_primary_caps * grid^2`` (16 in the papers' configurations)."""
        return self.n_primary_caps * self.primary_grid**2

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)


EFFICIENT_PRESETS = {
    "mnist": EfficientCapsNetConfig.mnist,
    "multimnist": EfficientCapsNetConfig.multimnist,
    "smallnorb": EfficientCapsNetConfig.smallnorb,
}


# ----------------------------------------------------------------------------------------- initialisers
def _glorot_uniform_(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    with torch.no_grad():
        w.uniform_(-limit, limit)


def _glorot_normal_(w: torch.Tensor, fan_in: int, fan_out: int) -> None:
    std = math.sqrt(2.0 / (fan_in + fan_out)) / TRUNC_NORMAL_STD
    with torch.no_grad():
        nn.init.trunc_normal_(w, 0.0, std, -2.0 * std, 2.0 * std)


def _keras_fans_torch(w: torch.Tensor) -> tuple[int, int]:
    """Keras fans of a PyTorch weight: Linear ``[out, in]`` -> Keras ``(in, out)``; Conv ``[out, in/g, kh, kw]``
    -> Keras ``(kh, kw, in/g, out)``."""
    if w.dim() == 2:
        return keras_fans((w.shape[1], w.shape[0]))
    return keras_fans((*w.shape[2:], w.shape[1], w.shape[0]))


def _zero_bias(m: nn.Module) -> None:
    if getattr(m, "bias", None) is not None:
        with torch.no_grad():
            m.bias.zero_()


# ------------------------------------------------------------------------------------------- decoders


# ---------------------------------------------------------------------------------------------- model
class EfficientCapsNet(nn.Module):
    """Conv backbone -> depthwise PrimaryCaps -> FCCaps (self-attention routing) -> lengths, with an optional
    masked decoder.

    ``forward(x, y=None, return_routing=False) -> CapsuleOutput``. With ``y`` (labels ``[B]``, ``[B, k]``
    labels, or a ``[B, K]`` multi-hot) the decoder reconstructs from the label's capsule(s); without, from
    the ``mask_k`` longest capsules. With ``decode_separately`` (MultiMNIST) ``out.extra["reconstructions"]``
    holds one decode per kept capsule, ``[B, k, C, H, W]``, as the official MultiMNIST model (each weighted
    0.196 in its loss).

    Parameters
    ----------
    config : EfficientCapsNetConfig, optional
        The hyper-parameters; ``None`` (default) for ``EfficientCapsNetConfig()``, the paper's MNIST model.
    overrides
        Keyword arguments: fields of the config to replace.
    """

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]``: in [0, 1] for the MNIST presets (``predict``
        converts uint8), any finite values (standardised images) for the 2-channel smallNORB preset."""
        c = self.config
        return ImageContract(c.in_channels, c.image_size, None if c.in_channels == 2 else (0.0, 1.0))

    @checked
    def __init__(self, config: EfficientCapsNetConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = resolve_config(config, EfficientCapsNetConfig, overrides)
        cfg = replace(
            cfg,
            conv_channels=tuple(cfg.conv_channels),
            conv_kernels=tuple(cfg.conv_kernels),
            conv_strides=tuple(cfg.conv_strides),
            decoder_hidden=tuple(cfg.decoder_hidden),
        )
        if not len(cfg.conv_channels) == len(cfg.conv_kernels) == len(cfg.conv_strides):
            raise ValueError("conv_channels, conv_kernels and conv_strides need the same length")
        if cfg.norm not in ("batch", "instance"):
            raise ValueError(f"norm must be 'batch' or 'instance', got {cfg.norm!r}")
        if cfg.activation not in ("relu", "leaky_relu"):
            raise ValueError(f"activation must be 'relu' or 'leaky_relu', got {cfg.activation!r}")
        if cfg.decoder not in (None, "fc", "conv"):
            raise ValueError(f"decoder must be 'fc', 'conv' or None, got {cfg.decoder!r}")
        if cfg.init not in ("keras", "torch"):
            raise ValueError(f"init must be 'keras' or 'torch', got {cfg.init!r}")
        if min(cfg.feature_sizes()) < 1 or cfg.primary_grid < 1:
            what = "image_size" if cfg.stem_side is None else "stem_side"
            side = cfg.stem_side or cfg.image_size
            raise ValueError(f"{what} {side} is too small for the conv stack {cfg.feature_sizes()}")
        self.config = cfg
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        side = self.image_stem.out_side  # what the backbone reads and the decoder reconstructs

        layers: list[nn.Module] = []
        c_in = self.image_stem.out_channels
        for c, k, s in zip(cfg.conv_channels, cfg.conv_kernels, cfg.conv_strides):
            layers.append(nn.Conv2d(c_in, c, k, s))
            layers.append(nn.ReLU() if cfg.activation == "relu" else nn.LeakyReLU(cfg.leaky_slope))
            layers.append(
                nn.BatchNorm2d(c, eps=cfg.norm_eps, momentum=cfg.bn_momentum)
                if cfg.norm == "batch"
                else nn.InstanceNorm2d(c, eps=cfg.norm_eps, affine=True)
            )
            c_in = c
        self.backbone = nn.Sequential(*layers)
        self.primary = DepthwisePrimaryCapsules(
            c_in, cfg.primary_kernel, cfg.n_primary_caps, cfg.primary_dim, cfg.primary_stride
        )
        self.digits = SelfAttentionRouting(
            cfg.n_primary,
            cfg.n_classes,
            cfg.primary_dim,
            cfg.class_dim,
            eps=cfg.squash_eps,
            init="keras" if cfg.init == "keras" else "torch",
        )
        self.decoder: nn.Module | None
        if cfg.decoder == "fc":
            self.decoder = FCDecoder(cfg.n_classes, cfg.class_dim, (cfg.in_channels, side, side), cfg.decoder_hidden)
        elif cfg.decoder == "conv":
            self.decoder = UpsampleConvDecoder(cfg.n_classes, cfg.class_dim, cfg.in_channels, slope=cfg.decoder_slope)
            if self.decoder.out_size != side:
                raise ValueError(
                    f"the conv decoder produces {self.decoder.out_size}x{self.decoder.out_size} images, "
                    f"not {side}x{side}"
                )
        else:
            self.decoder = None
        if cfg.init == "keras":
            self._keras_init()

    def _keras_init(self) -> None:
        """The official Keras initialisers (see the module docstring)."""
        for m in self.backbone:
            if isinstance(m, nn.Conv2d):
                keras_he_normal_(m.weight, _keras_fans_torch(m.weight)[0])
                _zero_bias(m)
            elif isinstance(m, nn.InstanceNorm2d):  # tfa: gamma/beta "random_uniform" = U(-0.05, 0.05)
                with torch.no_grad():
                    m.weight.uniform_(-0.05, 0.05)
                    m.bias.uniform_(-0.05, 0.05)
        _glorot_uniform_(self.primary.conv.weight, *_keras_fans_torch(self.primary.conv.weight))
        _zero_bias(self.primary.conv)
        if isinstance(self.decoder, FCDecoder):
            linears = [m for m in self.decoder.net if isinstance(m, nn.Linear)]
            for m in linears[:-1]:
                keras_he_normal_(m.weight, m.in_features)
                _zero_bias(m)
            _glorot_normal_(linears[-1].weight, linears[-1].in_features, linears[-1].out_features)
            _zero_bias(linears[-1])
        elif isinstance(self.decoder, UpsampleConvDecoder):
            for m in [self.decoder.fc, *self.decoder.convs, self.decoder.out]:
                _glorot_uniform_(m.weight, *_keras_fans_torch(m.weight))
                _zero_bias(m)

    # ------------------------------------------------------------------------------------------ parts
    def num_parameters(self, include_decoder: bool = False) -> int:
        """Trainable parameters; without the decoder by default (the paper's and the official summary's count).

        Parameters
        ----------
        include_decoder : bool, optional
            Count the decoder's parameters too (default ``False``).

        Returns
        -------
        int
            The number of trainable parameters.
        """
        return sum(
            p.numel()
            for n, p in self.named_parameters()
            if p.requires_grad and (include_decoder or not n.startswith("decoder."))
        )

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone features of images.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images, checked against :attr:`input_contract`.

        Returns
        -------
        torch.Tensor
            ``[B, conv_channels[-1], h, w]`` (``[B, 128, 9, 9]`` for MNIST).
        """
        check_images(x, self.input_contract)
        return self.backbone(self.image_stem(x))

    def primary_capsules(self, x: torch.Tensor) -> torch.Tensor:
        """The primary capsules of images.

        Parameters
        ----------
        x : torch.Tensor
            Images; :meth:`features` checks them.

        Returns
        -------
        torch.Tensor
            ``[B, n_primary, primary_dim]`` (``[B, 16, 8]`` in the papers' configurations).
        """
        return self.primary(self.features(x))

    def reconstruct(self, poses: torch.Tensor, y: torch.Tensor | None = None, k: int | None = None) -> torch.Tensor:
        """Decode class capsules masked by ``y`` (or the ``k`` longest); ``ValueError`` without a decoder.

        Parameters
        ----------
        poses, y, k
            As in :meth:`~capsule_lib.models.capsnet.CapsNet.reconstruct`.

        Returns
        -------
        torch.Tensor
            ``[B, C, H, W]`` reconstructions.
        """
        if self.decoder is None:
            raise ValueError("this EfficientCapsNet was built with decoder=None")
        return self.decoder(mask_capsules(poses, y, k or self.config.mask_k))

    def reconstruct_each(
        self, poses: torch.Tensor, y: torch.Tensor | None = None, k: int | None = None
    ) -> torch.Tensor:
        """Decode each selected capsule on its own (official MultiMNIST); ``ValueError`` without a decoder.

        Parameters
        ----------
        poses : torch.Tensor
            ``[B, K, D]`` class capsules.
        y : torch.Tensor, optional
            Labels ``[B]`` (k = 1), labels ``[B, k]``, or a ``[B, K]`` (multi-)hot (its ``k`` largest entries);
            ``None`` (default): the ``k`` longest capsules, longest first.
        k : int, optional
            Capsules to decode for a multi-hot or no ``y``; ``None`` (default) uses the config's ``mask_k``.

        Returns
        -------
        torch.Tensor
            ``[B, k, C, H, W]``: one reconstruction per selected capsule.
        """
        if self.decoder is None:
            raise ValueError("this EfficientCapsNet was built with decoder=None")
        check_tensor(poses, "poses", "[B, K, D]", [None, self.config.n_classes, self.config.class_dim])
        B, K, _ = poses.shape
        k = k or self.config.mask_k
        if y is None:
            idx = capsule_lengths(poses).topk(k, dim=1).indices  # [B, k]
        elif y.dim() == 1:
            idx = y.long().view(B, 1)
        elif y.dim() == 2 and y.dtype in (torch.int64, torch.int32) and y.shape[1] != K:
            idx = y.long()  # [B, k] labels
        elif y.dim() == 2 and y.shape[1] == K:
            idx = y.float().topk(k, dim=1).indices  # [B, k], the k largest entries of the (multi-)hot
        else:
            raise ValueError(f"y: expected labels [B], [B, k] or a mask [B, {K}], got {tuple(y.shape)}")
        sel = F.one_hot(idx, K).to(poses.dtype)  # [B, k, K]
        masked = poses.unsqueeze(1) * sel.unsqueeze(-1)  # [B, k, K, D]
        out = self.decoder(masked.flatten(0, 1))  # [B*k, C, H, W]
        return out.view(B, idx.shape[1], *out.shape[1:])

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, return_routing: bool = False) -> CapsuleOutput:
        """Images -> class capsules (and reconstructions).

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images (``[B, 1, 28, 28]`` by default; see
            :attr:`input_contract`).
        y : torch.Tensor, optional
            Labels ``[B]``, labels ``[B, k]`` or a ``[B, K]`` multi-hot whose capsules the decoder reconstructs
            from; ``None`` (default): the ``mask_k`` longest.
        return_routing : bool, optional
            Also record the routing's :class:`~capsule_lib.types.RoutingTrace` (default ``False``).

        Returns
        -------
        CapsuleOutput
            ``scores`` = capsule lengths ``[B, n_classes]`` (``kind="lengths"``), ``poses``
            ``[B, n_classes, class_dim]``, ``reconstruction [B, C, H, W]`` (``None`` without a decoder), ``trace``
            with ``return_routing``; with ``decode_separately``, ``extra["reconstructions"] [B, k, C, H, W]``; with a
            stem that resizes, ``extra["reconstruction_target"]`` (the images as the stem resizes them).
        """
        check_model_input(x, self)
        u = self.primary_capsules(x)  # [B, 16, 8]
        if return_routing:
            v, trace = self.digits(u, return_routing=True)  # [B, K, 16]
        else:
            v, trace = self.digits(u), None
        lengths = capsule_lengths(v, eps=self.config.length_eps)  # [B, K]
        recon, extra = None, {}
        if self.decoder is not None:
            recon = self.reconstruct(v, y)
            if self.config.decode_separately:
                extra["reconstructions"] = self.reconstruct_each(v, y)
            if self.image_stem.resizes:  # what the decoder reconstructs: the image as the stem resizes it
                extra["reconstruction_target"] = self.image_stem.resize(x)  # [B, C, stem_side, stem_side]
        return CapsuleOutput(lengths, "lengths", v, recon, trace, extra)
