"""Input validation shared by every layer: clear ``ValueError`` messages that name the expected shape."""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["check_tensor"]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(
    x: torch.Tensor,
    name: str,
    spec: str,
    sizes: Sequence[int | None],
    *,
    min_leading: int | None = None,
    floating: bool = True,
) -> None:
    """Check the trailing dimensions of ``x`` against ``sizes`` (``None`` = any size).

    ``spec`` is the human-readable shape, e.g. ``"[B, n_inp, d_inp]"``; it is quoted in the error.
    If ``min_leading`` is ``None`` the tensor must have exactly ``len(sizes)`` dimensions; otherwise it
    may have ``min_leading`` or more extra leading (batch-like) dimensions.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape {spec}, got {type(x).__name__}")
    if floating and x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a floating-point tensor of shape {spec}, got dtype {x.dtype}")
    n = len(sizes)
    if min_leading is None:
        ok_ndim = x.dim() == n
    else:
        ok_ndim = x.dim() >= n + min_leading
    if not ok_ndim:
        raise ValueError(f"{name}: expected shape {spec}, got {tuple(x.shape)} ({x.dim()} dims)")
    tail = x.shape[x.dim() - n:]
    for got, want in zip(tail, sizes):
        if want is not None and got != want:
            raise ValueError(f"{name}: expected shape {spec} with sizes {_fmt(sizes)}, got {tuple(x.shape)}")


def _fmt(sizes: Sequence[int | None]) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in sizes) + ")"
