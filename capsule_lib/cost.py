"""What a routing layer costs: activation memory kept for the backward pass and time of a forward+backward,
measured the same way for every algorithm (the Heinsen chapter's scaling plot and the comparison chapter).

Memory is counted as the bytes of the distinct tensors autograd **saves for backward** during the forward
pass (``torch.autograd.graph.saved_tensors_hooks``; parameters excluded, each storage counted once). It is
what grows with the number of input and output capsules, it is exact and the same on every device, unlike a
CPU process's peak memory. Time is the median over ``repeats`` calls (after one warm-up) of forward +
backward on the current device and thread count: a property of this machine, not of the algorithm alone.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["saved_bytes", "time_forward_backward", "ROUTING_KINDS", "routing_layer", "routing_scaling", "loglog_slope"]

#: the routing layers :func:`routing_layer` builds, with their per-pair weights
ROUTING_KINDS = {
    "dynamic": "dynamic routing (Sabour et al. 2017), one d x d matrix per pair",
    "heinsen_2019": "Heinsen (2019) generative matrix routing, d_cov = 1, one 1 x d -> 1 x d matrix per pair",
    "heinsen_2022": "Heinsen (2022) efficient vector routing (memory_efficient=True)",
}


def saved_bytes(fn: Callable[[], Any], exclude: Sequence[torch.Tensor] = ()) -> tuple[Any, int]:
    """``(fn(), bytes)``: the bytes of the distinct storages autograd saved for backward while ``fn`` ran,
    not counting the storages of ``exclude`` (e.g. the parameters)."""
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in skip:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values())


def time_forward_backward(fn: Callable[[], torch.Tensor], repeats: int = 3) -> float:
    """Median seconds of ``fn().backward()`` over ``repeats`` calls, after one warm-up call."""
    times = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        fn().backward()
        if k:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def routing_layer(kind: str, n_inp: int, n_out: int, d: int, batch: int = 4, seed: int = 0):
    """``(module, make_loss)`` for one routing layer of ``kind`` (a key of :data:`ROUTING_KINDS`) from
    ``n_inp`` to ``n_out`` capsules of size ``d``: ``make_loss()`` runs the forward pass on fixed random
    inputs (``batch`` examples) and returns a scalar to backpropagate."""
    from .routing.dynamic import DynamicRouting
    from .routing.heinsen import EfficientVectorRouting, GenerativeMatrixRouting

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n_inp, d, generator=g).requires_grad_()
    if kind == "dynamic":
        m: nn.Module = DynamicRouting(n_inp, n_out, d, d)
        return m, lambda: m(x).square().sum()
    if kind == "heinsen_2019":
        m = GenerativeMatrixRouting(d_cov=1, d_inp=d, d_out=d, n_inp=n_inp, n_out=n_out)
        a = torch.randn(batch, n_inp, generator=g)
        return m, lambda: sum(t.square().sum() for t in m(a, x.unsqueeze(-2)))
    if kind == "heinsen_2022":
        m = EfficientVectorRouting(n_inp, n_out, d, d)
        return m, lambda: m(x).square().sum()
    raise ValueError(f"unknown routing kind {kind!r}; kinds: {', '.join(ROUTING_KINDS)}")


def routing_scaling(
    sizes: Sequence[tuple[int, int]],
    kinds: Sequence[str] = tuple(ROUTING_KINDS),
    d: int = 16,
    batch: int = 4,
    repeats: int = 3,
    time_it: bool = True,
) -> list[dict[str, Any]]:
    """One row per (kind, (n_inp, n_out)) of ``sizes``: ``saved_mib`` (activation memory, see the module
    docstring), ``ms`` (forward + backward, median; ``None`` without ``time_it``), ``params``."""
    rows = []
    for kind in kinds:
        for n_inp, n_out in sizes:
            m, loss = routing_layer(kind, n_inp, n_out, d, batch)
            params = list(m.parameters())
            _, nbytes = saved_bytes(loss, exclude=params)
            ms = 1e3 * time_forward_backward(loss, repeats) if time_it else None
            rows.append(
                {
                    "kind": kind,
                    "n_inp": n_inp,
                    "n_out": n_out,
                    "d": d,
                    "batch": batch,
                    "saved_mib": nbytes / 2**20,
                    "ms": ms,
                    "params": sum(p.numel() for p in params),
                }
            )
    return rows


def loglog_slope(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x`` (1 = linear growth, 2 = quadratic)."""
    lx, ly = [math.log(v) for v in x], [math.log(v) for v in y]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
