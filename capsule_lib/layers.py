"""Capsule building blocks shared by the models: primary capsules, masking and decoders."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_tensor
from .functional import capsule_lengths, squash

__all__ = [
    "PrimaryCapsules", "DepthwisePrimaryCapsules", "mask_capsules", "Mask", "FCDecoder", "GemmConv2d",
    "bf16_gemm_conv2d",
]


class _BF16GemmConv(torch.autograd.Function):
    """Convolution as one bf16 matrix product (im2col), with a hand-written backward (two bf16 matrix
    products and a col2im). On CPUs with bf16 matrix units (e.g. Intel AMX) this is several times faster than
    the library convolution for CapsNet's 9x9 stride-2 primary-capsule layer; inputs and weights are rounded to
    bf16, products accumulate in fp32 (relative error ~3e-3, as under bf16 autocast)."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride: int):
        B, C, H, W = x.shape
        O, _, kh, kw = weight.shape
        oh, ow = (H - kh) // stride + 1, (W - kw) // stride + 1
        xc = x.to(torch.bfloat16).permute(0, 2, 3, 1).contiguous()  # [B, H, W, C]
        s = xc.stride()
        cols = xc.as_strided((B, oh, ow, kh, kw, C), (s[0], stride * s[1], stride * s[2], s[1], s[2], s[3]))
        cols = cols.reshape(B * oh * ow, kh * kw * C)  # [B*oh*ow, kh*kw*C]
        wm = weight.to(torch.bfloat16).permute(2, 3, 1, 0).reshape(kh * kw * C, O)  # [kh*kw*C, O]
        out = torch.mm(cols, wm).to(x.dtype)  # [B*oh*ow, O]
        if bias is not None:
            out = out + bias.to(out.dtype)
        ctx.save_for_backward(cols, wm)
        ctx.geom = (B, C, H, W, O, kh, kw, oh, ow, stride, bias is not None, x.dtype, weight.dtype)
        return out.view(B, oh, ow, O).permute(0, 3, 1, 2)  # [B, O, oh, ow]

    @staticmethod
    def backward(ctx, grad):
        cols, wm = ctx.saved_tensors
        B, C, H, W, O, kh, kw, oh, ow, stride, has_bias, xdt, wdt = ctx.geom
        g = grad.permute(0, 2, 3, 1).reshape(B * oh * ow, O)  # [B*oh*ow, O]
        gbias = g.sum(0).to(wdt) if has_bias else None
        g16 = g.to(torch.bfloat16)
        gw = torch.mm(cols.t(), g16).view(kh, kw, C, O).permute(3, 2, 0, 1).to(wdt)  # [O, C, kh, kw]
        gcols = torch.mm(g16, wm.t()).view(B, oh, ow, kh, kw, C)  # [B, oh, ow, kh, kw, C]
        # col2im in channels-last: accumulate each kernel tap's [B, oh, ow, C] slab into its strided window of
        # the input gradient (kh*kw vectorised adds; 2-3x faster here than F.fold plus its layout copy)
        gx = torch.zeros(B, H, W, C, dtype=torch.float32, device=grad.device)
        span_h, span_w = stride * (oh - 1) + 1, stride * (ow - 1) + 1
        for i in range(kh):
            for j in range(kw):
                gx[:, i:i + span_h:stride, j:j + span_w:stride, :] += gcols[:, :, :, i, j, :]
        return gx.permute(0, 3, 1, 2).to(xdt), gw, gbias, None


def bf16_gemm_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: int = 1) -> torch.Tensor:
    """``F.conv2d`` (valid padding, no dilation/groups) computed as one bf16 GEMM; see :class:`GemmConv2d`."""
    return _BF16GemmConv.apply(x, weight, bias, stride)


class GemmConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` (same parameters and state dict) whose forward on CPU is :func:`bf16_gemm_conv2d`.

    For training on CPUs with bf16 matrix units; elsewhere (CUDA, padding, groups, dilation) it is the
    ordinary convolution. Numerics are those of bf16 autocast.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        simple = (self.padding == (0, 0) and self.dilation == (1, 1) and self.groups == 1
                  and self.stride[0] == self.stride[1])
        if x.device.type == "cpu" and simple:
            return bf16_gemm_conv2d(x, self.weight, self.bias, self.stride[0])
        return super().forward(x)


class PrimaryCapsules(nn.Module):
    """Convolutional primary capsules (Sabour et al. 2017): ``[B, C, H, W] -> [B, n_types*h*w, d_caps]``.

    One convolution with ``n_types * d_caps`` output channels; output channel ``c*d_caps + a`` is
    dimension ``a`` of capsule type ``c`` (the official layout). Capsules are ordered **type-major**,
    ``i = c*h*w + y*w + x`` (the official transpose to ``[B, n_types, h, w, d]``), then squashed over ``d``.
    ``grid(x)`` returns the unflattened ``[B, n_types, h, w, d_caps]`` view for figures.
    ``conv="bf16_gemm"`` computes the convolution with :class:`GemmConv2d` (faster CPU training, bf16
    numerics; same state dict).
    """

    def __init__(
        self,
        in_channels: int = 256,
        n_types: int = 32,
        d_caps: int = 8,
        kernel_size: int = 9,
        stride: int = 2,
        squash_kind: str = "hinton",
        conv: str = "standard",
    ) -> None:
        super().__init__()
        if conv not in ("standard", "bf16_gemm"):
            raise ValueError(f"conv must be 'standard' or 'bf16_gemm', got {conv!r}")
        self.in_channels, self.n_types, self.d_caps, self.squash_kind = in_channels, n_types, d_caps, squash_kind
        conv_cls = GemmConv2d if conv == "bf16_gemm" else nn.Conv2d
        self.conv = conv_cls(in_channels, n_types * d_caps, kernel_size, stride)

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x", f"[B, C={self.in_channels}, H, W]", [None, self.in_channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, N*D, h, w]
        _, _, H, W = h.shape
        h = h.view(B, self.n_types, self.d_caps, H, W).permute(0, 1, 3, 4, 2)  # [B, N, h, w, D]
        return squash(h, self.squash_kind)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.grid(x)  # [B, N, h, w, D]
        return g.reshape(g.shape[0], -1, self.d_caps)  # [B, N*h*w, D], type-major


class DepthwisePrimaryCapsules(nn.Module):
    """Efficient-CapsNet primary capsules: depthwise conv ``F x K x K`` (groups=F), valid padding, then
    reshape the ``F`` channels into ``n_caps`` capsules of ``d_caps`` (capsule n = channels
    ``n*d_caps .. n*d_caps+d_caps-1``) and squash_E. ``[B, F, H, W] -> [B, n_caps * h*w, d_caps]``
    (``h = w = 1`` in the papers' configurations).
    """

    def __init__(self, channels: int = 128, kernel_size: int = 9, n_caps: int = 16, d_caps: int = 8,
                 stride: int = 1, squash_kind: str = "efficient") -> None:
        super().__init__()
        if n_caps * d_caps != channels:
            raise ValueError(f"n_caps*d_caps must equal channels ({n_caps}*{d_caps} != {channels})")
        self.channels, self.n_caps, self.d_caps, self.squash_kind = channels, n_caps, d_caps, squash_kind
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor(x, "x", f"[B, F={self.channels}, H, W]", [None, self.channels, None, None])
        B = x.shape[0]
        h = self.conv(x)  # [B, F, h, w]
        h = h.permute(0, 2, 3, 1).reshape(B, -1, self.d_caps)  # [B, h*w*n_caps, D]
        return squash(h, self.squash_kind)


def mask_capsules(v: torch.Tensor, y: torch.Tensor | None = None, k: int = 1) -> torch.Tensor:
    """Zero every capsule except the selected ones: ``[B, J, D] -> [B, J, D]``.

    ``y``: integer labels ``[B]`` (keep the label's capsule), ``[B, k]`` labels, or a ``[B, J]`` 0/1 mask;
    if ``None``, keep the ``k`` longest capsules (``k=2`` for MultiMNIST).
    """
    check_tensor(v, "v", "[B, J, D]", [None, None, None])
    B, J, _ = v.shape
    if y is None:
        idx = capsule_lengths(v).topk(k, dim=1).indices  # [B, k]
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, idx, 1.0)
    elif y.dim() == 1:
        m = F.one_hot(y.long(), J).to(v.dtype)
    elif y.dim() == 2 and y.dtype in (torch.int64, torch.int32) and y.shape[1] != J:
        m = torch.zeros(B, J, dtype=v.dtype, device=v.device).scatter_(1, y.long(), 1.0)
    elif y.dim() == 2 and y.shape[1] == J:
        m = y.to(v.dtype)
    else:
        raise ValueError(f"y: expected labels [B], [B, k] or a mask [B, {J}], got {tuple(y.shape)}")
    return v * m.unsqueeze(-1)


class Mask(nn.Module):
    """Module form of :func:`mask_capsules`."""

    def __init__(self, k: int = 1) -> None:
        super().__init__()
        self.k = k

    def forward(self, v: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return mask_capsules(v, y, self.k)


class FCDecoder(nn.Module):
    """Reconstruction decoder: masked capsules ``[B, J, D]`` -> image ``[B, *out_shape]`` in [0, 1].

    ``J*D -> hidden[0] -> hidden[1] -> prod(out_shape)``, ReLU then sigmoid (Sabour: 160-512-1024-784).
    """

    def __init__(self, n_caps: int = 10, d_caps: int = 16, out_shape: tuple[int, ...] = (1, 28, 28),
                 hidden: tuple[int, ...] = (512, 1024)) -> None:
        super().__init__()
        self.n_caps, self.d_caps, self.out_shape = n_caps, d_caps, tuple(out_shape)
        dims = [n_caps * d_caps, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(dims[:-1], dims[1:]):
            layers += [nn.Linear(a, b), nn.ReLU(inplace=True)]
        n_out = 1
        for s in self.out_shape:
            n_out *= s
        layers += [nn.Linear(dims[-1], n_out), nn.Sigmoid()]
        self.net = nn.Sequential(*layers)

    def forward(self, masked: torch.Tensor) -> torch.Tensor:
        check_tensor(masked, "masked", f"[B, {self.n_caps}, {self.d_caps}]", [None, self.n_caps, self.d_caps])
        return self.net(masked.flatten(1)).view(-1, *self.out_shape)
