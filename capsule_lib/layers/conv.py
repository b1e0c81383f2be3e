"""Plain convolutions with a faster bf16 path (used by the capsule models' stems)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["GemmConv2d", "bf16_gemm_conv2d"]


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
                gx[:, i : i + span_h : stride, j : j + span_w : stride, :] += gcols[:, :, :, i, j, :]
        return gx.permute(0, 3, 1, 2).to(xdt), gw, gbias, None


def bf16_gemm_conv2d(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, stride: int = 1
) -> torch.Tensor:
    """``F.conv2d`` (valid padding, no dilation/groups) computed as one bf16 GEMM; see :class:`GemmConv2d`.

    Parameters
    ----------
    x : torch.Tensor
        ``[B, C, H, W]`` input; rounded to bf16 for the product.
    weight : torch.Tensor
        ``[O, C, kh, kw]`` kernels; rounded to bf16 for the product.
    bias : torch.Tensor or None, optional
        ``[O]`` bias added in the output's dtype; ``None`` (default) adds none.
    stride : int, optional
        The stride along both axes (default 1).

    Returns
    -------
    torch.Tensor
        ``[B, O, oh, ow]`` in ``x``'s dtype, ``oh = (H - kh) // stride + 1`` (likewise ``ow``); products
        accumulate in fp32.
    """
    return _BF16GemmConv.apply(x, weight, bias, stride)


class GemmConv2d(nn.Conv2d):
    """An ``nn.Conv2d`` (same parameters and state dict) whose forward on CPU is :func:`bf16_gemm_conv2d`.

    For training on CPUs with bf16 matrix units; elsewhere (CUDA, padding, groups, dilation, unequal strides) it is
    the ordinary convolution. Numerics are those of bf16 autocast.

    Parameters
    ----------
    in_channels, out_channels : int
        Input channels ``C`` and output channels ``O``.
    kernel_size : int or tuple of int
        Kernel size ``k`` or ``(kh, kw)``.
    stride : int or tuple of int, optional
        Stride (default 1); the bf16 path needs equal strides along both axes.
    padding : int, tuple of int or str, optional
        Padding, as in ``torch.nn.Conv2d`` (default 0); the bf16 path needs none.
    dilation : int or tuple of int, optional
        Dilation (default 1); the bf16 path needs 1.
    groups : int, optional
        Channel groups (default 1); the bf16 path needs 1.
    bias : bool, optional
        Learn an output bias ``[O]`` (default ``True``).
    padding_mode : str, optional
        ``"zeros"`` (default), ``"reflect"``, ``"replicate"`` or ``"circular"``, as in ``torch.nn.Conv2d``.
    device : torch.device, optional
        Device of the parameters (default: PyTorch's).
    dtype : torch.dtype, optional
        dtype of the parameters (default: PyTorch's).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve ``x``, by :func:`bf16_gemm_conv2d` on the CPU when the convolution allows it.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, H, W]`` input (rounded to bf16 on the CPU fast path).

        Returns
        -------
        torch.Tensor
            ``[B, out_channels, oh, ow]``, as ``torch.nn.Conv2d`` gives (bf16 numerics on the fast path).
        """
        simple = (
            self.padding == (0, 0) and self.dilation == (1, 1) and self.groups == 1 and self.stride[0] == self.stride[1]
        )
        if x.device.type == "cpu" and simple:
            return bf16_gemm_conv2d(x, self.weight, self.bias, self.stride[0])
        return super().forward(x)
