"""Helpers shared by the routing algorithms (private)."""

from __future__ import annotations

from typing import Any

import torch

from ..types import RoutingTrace


def autocast_outputs(result: Any, device_type: str) -> Any:
    """Under ``torch.autocast`` every routing layer returns its outputs in the autocast dtype (as the matmul
    that makes its votes would), whatever precision its internals use; a trace, if present, is left as is
    (its tensors stay in the precision they were computed in). Outside autocast ``result`` is unchanged.

    ``result``: a tensor, a tuple of tensors, or ``(outputs, RoutingTrace)`` from ``return_routing=True``."""
    if not torch.is_autocast_enabled(device_type):
        return result
    dtype = torch.get_autocast_dtype(device_type)

    def cast(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64:
            return x.to(dtype)
        if isinstance(x, tuple) and not isinstance(x, RoutingTrace):
            return tuple(cast(t) for t in x)
        return x

    return cast(result)


def fused_path_ok(*tensors: torch.Tensor) -> bool:
    """Whether a routing layer's hand-written fused function computes exactly what its plain path would: every
    tensor float32 or float64 and of one dtype, no autocast on their device (which would run the plain path's
    products in half precision), and not being traced by ``torch.compile`` (which compiles the plain path)."""
    dtype = tensors[0].dtype
    return (
        dtype in (torch.float32, torch.float64)
        and all(t.dtype == dtype for t in tensors)
        and not torch.is_autocast_enabled(tensors[0].device.type)
        and not torch.compiler.is_compiling()
    )
