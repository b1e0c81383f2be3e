"""The one object every routing algorithm returns when asked for its internals (``return_routing=True``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["RoutingTrace"]


@dataclass
class RoutingTrace:
    """Internals of one routing call, per iteration, for figures and widgets.

    Attributes
    ----------
    coefficients:
        One tensor per iteration with the routing (coupling) coefficients used **in** that iteration,
        shaped ``[B, n_inp, n_out]`` (FC routing) or ``[B, ..., n_inp, n_out]``. They sum to 1 over the
        parent axis ``n_out`` (the last axis) for every algorithm except where documented.
    agreements:
        One tensor per iteration with the agreement computed **after** that iteration's outputs (the
        quantity that updates the logits: dot products for dynamic routing, log-likelihoods for EM /
        Heinsen, scaled dot products for inverted attention). Same shape as ``coefficients``.
    outputs:
        Output capsules after each iteration (poses), ``[B, n_out, d_out]``-like.
    activations:
        Output activations/scores after each iteration where the algorithm has them (else empty).
    algorithm:
        Name of the algorithm (``"dynamic"``, ``"em"``, ``"heinsen"``, ``"inverted"``, ``"self_attention"``...).
    extra:
        Algorithm-specific tensors (e.g. the self-attention matrix, variances, D-step shares).
    """

    algorithm: str
    coefficients: list[torch.Tensor] = field(default_factory=list)
    agreements: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    activations: list[torch.Tensor] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def n_iters(self) -> int:
        return len(self.coefficients)

    def detach(self) -> "RoutingTrace":
        """A copy with every tensor detached and moved to the CPU (safe to keep for plotting)."""

        def d(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return x.detach().cpu()
            if isinstance(x, list):
                return [d(t) for t in x]
            if isinstance(x, tuple):
                return tuple(d(t) for t in x)
            if isinstance(x, dict):
                return {k: d(v) for k, v in x.items()}
            return x

        return RoutingTrace(
            algorithm=self.algorithm,
            coefficients=d(self.coefficients),
            agreements=d(self.agreements),
            outputs=d(self.outputs),
            activations=d(self.activations),
            extra=d(self.extra),
        )

    def stacked(self, name: str = "coefficients") -> torch.Tensor:
        """Stack one per-iteration list into a tensor ``[T, ...]``."""
        return torch.stack(getattr(self, name), dim=0)


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
