"""Primary capsules, the first capsule layer of every model: convolutional (Sabour et al.), depthwise
(Mazzia et al.), matrix (Hinton et al.) and LayerNorm (Tsai et al.)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._checks import check_tensor
from ..functional import squash
from .conv import GemmConv2d

__all__ = ["PrimaryCapsules", "DepthwisePrimaryCapsules", "MatrixPrimaryCapsules", "InvertedPrimaryCapsules"]


class PrimaryCapsules(nn.Module):
    """Convolutional primary capsules (Sabour et al. 2017): ``[B, C, H, W] -> [B, n_types*h*w, caps_dim]``.

    One convolution with ``n_types * caps_dim`` output channels; output channel ``c*caps_dim + a`` is
    dimension ``a`` of capsule type ``c`` (the official layout). Capsules are ordered **type-major**,
    ``i = c*h*w + y*w + x`` (the official transpose to ``[B, n_types, h, w, d]``), then squashed over ``d``.
    ``grid(x)`` returns the unflattened ``[B, n_types, h, w, caps_dim]`` view for figures.

    Parameters
    ----------
    in_channels : int, optional
        Input channels ``C`` (default 256).
    n_types : int, optional
        Capsule types (default 32).
    caps_dim : int, optional
        Capsule dimension (default 8).
    kernel_size : int, optional
        Convolution kernel side, valid padding (default 9).
    stride : int, optional
        Convolution stride (default 2).
    squash_kind : str, optional
        A :func:`~capsule_lib.functional.squash` kind (default ``"hinton"``).
    conv : str, optional
        ``"standard"`` (default, ``nn.Conv2d``) or ``"bf16_gemm"``: :class:`~capsule_lib.layers.conv.GemmConv2d`
        (faster CPU training, bf16 numerics; same state dict).
    """

    def __init__(
        self,
        in_channels: int = 256,
        n_types: int = 32,
        caps_dim: int = 8,
        kernel_size: int = 9,
        stride: int = 2,
        squash_kind: str = "hinton",
        conv: str = "standard",
    ) -> None:
        super().__init__()
        if conv not in ("standard", "bf16_gemm"):
            raise ValueError(f"conv must be 'standard' or 'bf16_gemm', got {conv!r}")
        self.in_channels, self.n_types, self.caps_dim, self.squash_kind = in_channels, n_types, caps_dim, squash_kind
        conv_cls = GemmConv2d if conv == "bf16_gemm" else nn.Conv2d
        self.conv = conv_cls(in_channels, n_types * caps_dim, kernel_size, stride)

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        """The squashed capsules on their grid (for figures).

        Parameters
        ----------
        x : torch.Tensor
            As in :meth:`forward`.

        Returns
        -------
        torch.Tensor
            ``[B, n_types, h, w, caps_dim]``, squashed over ``caps_dim``; ``h = (H - kernel_size) // stride + 1``.
        """
        check_tensor(x, "x", f"[B, C={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, N*D, h, w]
        _, _, H, W = h.shape
        h = h.view(B, self.n_types, self.caps_dim, H, W).permute(0, 1, 3, 4, 2)  # [B, N, h, w, D]
        return squash(h, self.squash_kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Primary capsules of feature maps.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` feature maps.

        Returns
        -------
        torch.Tensor
            ``[B, n_types*h*w, caps_dim]`` squashed capsules, type-major (``i = c*h*w + y*w + x``).
        """
        g = self.grid(x)  # [B, N, h, w, D]
        return g.reshape(g.shape[0], -1, self.caps_dim)  # [B, N*h*w, D], type-major


class DepthwisePrimaryCapsules(nn.Module):
    """Efficient-CapsNet primary capsules: depthwise conv ``F x K x K`` (groups=F), valid padding, then
    reshape the ``F`` channels into ``n_caps`` capsules of ``caps_dim`` (capsule n = channels
    ``n*caps_dim .. n*caps_dim+caps_dim-1``) and squash_E. ``[B, F, H, W] -> [B, n_caps * h*w, caps_dim]``
    (``h = w = 1`` in the papers' configurations).

    Parameters
    ----------
    channels : int, optional
        Input and depthwise channels ``F`` (default 128); must equal ``n_caps * caps_dim``.
    kernel_size : int, optional
        Depthwise kernel side ``K``, valid padding (default 9).
    n_caps : int, optional
        Capsules per position (default 16).
    caps_dim : int, optional
        Capsule dimension (default 8).
    stride : int, optional
        Convolution stride (default 1).
    squash_kind : str, optional
        A :func:`~capsule_lib.functional.squash` kind (default ``"efficient"``, squash_E).
    """

    def __init__(
        self,
        channels: int = 128,
        kernel_size: int = 9,
        n_caps: int = 16,
        caps_dim: int = 8,
        stride: int = 1,
        squash_kind: str = "efficient",
    ) -> None:
        super().__init__()
        if n_caps * caps_dim != channels:
            raise ValueError(f"n_caps*caps_dim must equal channels ({n_caps}*{caps_dim} != {channels})")
        self.channels, self.n_caps, self.caps_dim, self.squash_kind = channels, n_caps, caps_dim, squash_kind
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Primary capsules of feature maps.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, channels, H, W]`` feature maps, ``H, W >= kernel_size`` (valid padding).

        Returns
        -------
        torch.Tensor
            ``[B, h*w*n_caps, caps_dim]`` squashed capsules, position-major (``i = (y*w + x)*n_caps + n``).
        """
        check_tensor(x, "x", f"[B, F={self.channels}, H, W]", [None, self.channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, F, h, w]
        h = h.permute(0, 2, 3, 1).reshape(B, -1, self.caps_dim)  # [B, h*w*n_caps, D]
        return squash(h, self.squash_kind)


class MatrixPrimaryCapsules(nn.Module):
    """Primary matrix capsules: ``[B, A, H, W] -> (poses [B, n_types, h, w, P*P], activations [B, n_types, h, w])``.

    Two convolutions on the same input (1x1 by default, as in the paper): one with ``n_types * P*P``
    channels for the poses (output channel ``t*P*P + d`` is pose entry ``d`` of type ``t``, row-major), one
    with ``n_types`` channels and a sigmoid for the activations. Parameters:
    ``A*n_types*(P*P+1)*k*k + n_types*(P*P+1)``.

    Parameters
    ----------
    in_channels : int
        Input channels ``A``.
    n_types : int
        Capsule types.
    pose_size : int, optional
        Poses are ``P x P`` matrices (default 4).
    kernel_size : int, optional
        Kernel side ``k`` of both convolutions (default 1).
    stride : int, optional
        Stride of both convolutions (default 1).
    padding : int, optional
        Zero padding of both convolutions (default 0).
    """

    def __init__(
        self,
        in_channels: int,
        n_types: int,
        pose_size: int = 4,
        kernel_size: int = 1,
        stride: int = 1,
        padding: int = 0,
    ) -> None:
        super().__init__()
        self.in_channels, self.n_types, self.pose_size = in_channels, n_types, pose_size
        self.pose = nn.Conv2d(in_channels, n_types * pose_size**2, kernel_size, stride, padding)
        self.activation = nn.Conv2d(in_channels, n_types, kernel_size, stride, padding)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Primary matrix capsules of feature maps.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` feature maps, read by both convolutions.

        Returns
        -------
        poses : torch.Tensor
            ``[B, n_types, h, w, P*P]`` row-major pose matrices.
        activations : torch.Tensor
            ``[B, n_types, h, w]`` in (0, 1).
        """
        check_tensor(x, "x", f"[B, A={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        p = self.pose(x)  # [B, T*D, h, w]
        B, _, h, w = p.shape
        poses = p.view(B, self.n_types, self.pose_size**2, h, w).permute(0, 1, 3, 4, 2)  # [B, T, h, w, D]
        acts = torch.sigmoid(self.activation(x))  # [B, T, h, w]
        return poses, acts


class InvertedPrimaryCapsules(nn.Module):
    """Primary capsules of Tsai et al.: conv1x1 (no bias) to ``n_types * d`` channels, channels-last split into
    ``(n_types, d)`` (type ``c`` owns channels ``c*d .. c*d+d-1``), then LayerNorm over ``d`` (no squash).
    ``[B, C, H, W] -> [B, n_types, H, W, d]``.

    Parameters
    ----------
    in_channels : int, optional
        Input channels ``C`` of the 1x1 convolution (default 128).
    n_types : int, optional
        Capsule types (default 32).
    pose_dim : int, optional
        Capsule dimension ``d`` (default 16).
    eps : float, optional
        LayerNorm epsilon (default 1e-5).
    """

    def __init__(self, in_channels: int = 128, n_types: int = 32, pose_dim: int = 16, eps: float = 1e-5) -> None:
        super().__init__()
        self.in_channels, self.n_types, self.pose_dim = in_channels, n_types, pose_dim
        self.conv = nn.Conv2d(in_channels, n_types * pose_dim, 1, bias=False)
        self.norm = nn.LayerNorm(pose_dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Primary capsules of feature maps.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` feature maps (the 1x1 convolution keeps ``H x W``).

        Returns
        -------
        torch.Tensor
            ``[B, n_types, H, W, pose_dim]`` layer-normalised poses (statistics in fp32 or fp64, result in
            the convolution's dtype).
        """
        check_tensor(x, "x", f"[B, C={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        u = self.conv(x)  # [B, N*d, H, W]
        B, _, H, W = u.shape
        u = u.permute(0, 2, 3, 1).reshape(B, H, W, self.n_types, self.pose_dim)  # [B, H, W, N, d]
        u = u.permute(0, 3, 1, 2, 4)  # [B, N, H, W, d]
        acc = torch.float64 if u.dtype == torch.float64 else torch.float32  # LayerNorm statistics in fp32+
        return F.layer_norm(
            u.to(acc), (self.pose_dim,), self.norm.weight.to(acc), self.norm.bias.to(acc), self.norm.eps
        ).to(u.dtype)
