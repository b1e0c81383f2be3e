"""Inputs of the exercises' cases: seeded tensors, labels, and cases whose expected outputs a reference computes."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .checker import Case

F64 = torch.float64


def _randn(*shape: int, seed: int = 0, scale: float = 1.0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=F64) * scale).to(dtype)


def _rand(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64).to(dtype)


def _labels(n: int, k: int, seed: int) -> torch.Tensor:
    return torch.randint(0, k, (n,), generator=torch.Generator().manual_seed(seed))


def _cases(ref: Callable, specs: list[tuple], grad: str = "exact", wrt: tuple[int, ...] = (0,)) -> list[Case]:
    """Cases ``(name, args[, grad[, atol]])`` whose expected outputs are ``ref(*args)``."""
    out = []
    for name, args, *rest in specs:
        g = rest[0] if rest else grad
        atol = rest[1] if len(rest) > 1 else None
        out.append(Case(name, args, ref(*args), g, wrt, ref if g == "exact" else None, atol))
    return out
