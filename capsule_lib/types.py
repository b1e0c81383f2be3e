"""The types every layer, routing algorithm and model shares, and the library's shared constants.

This module is at the bottom of the library: it imports nothing from ``capsule_lib``.

* :class:`Routed`: what every routing layer's :meth:`~capsule_lib.routing._common.RoutingProtocol.route` returns
  (the routing protocol).
* :class:`RoutingTrace`: what every routing algorithm returns with ``return_routing=True``.
* :class:`CapsuleOutput`: what every capsule classifier returns.
* :class:`ImageContract`: what images a model reads (``model.input_contract``).
* :data:`TRUNC_NORMAL_STD`: the standard deviation of a unit normal truncated to ``[-2, 2]`` (Keras'
  ``truncated_normal`` initialisers divide by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

import torch

__all__ = [
    "Routed",
    "RoutingTrace",
    "CapsuleOutput",
    "ImageContract",
    "ScoreKind",
    "SCORE_KINDS",
    "COUPLINGS",
    "TRUNC_NORMAL_STD",
]

#: Standard deviation of a standard normal truncated to [-2, 2] (Keras' ``VarianceScaling`` "truncated_normal").
TRUNC_NORMAL_STD = 0.87962566103423978

ScoreKind = Literal["lengths", "activations", "logits"]
#: The kinds of :attr:`CapsuleOutput.scores`; capsule lengths in [0, 1) (CapsNet, Efficient-CapsNet),
#: activations in (0, 1) (EM), or unnormalised logits (Heinsen, inverted attention, the CNN baseline).
SCORE_KINDS: tuple[str, ...] = ("lengths", "activations", "logits")
#: The couplings a routing layer can route with (``layer.route(..., couplings=)``): its algorithm's (``"routed"``), or
#: Paik et al.'s (2019) baselines, fixed in one pass: all equal (``"uniform"``) or drawn at random (``"random"``).
COUPLINGS: tuple[str, ...] = ("routed", "uniform", "random")


class Routed(NamedTuple):
    """What a routing layer's ``route(poses, activations=None, *, iterations=None, return_routing=False)`` returns,
    for every algorithm alike (the routing protocol; :mod:`capsule_lib.routing.kinds` registers the algorithms).

    Attributes
    ----------
    poses : torch.Tensor
        ``[B, n_out, d_out]``, the output capsules (matrix capsules flattened, ``P x P -> P*P``).
    activations : torch.Tensor or None
        ``[B, n_out]``, the output capsules' activations on the scale the algorithm's registry entry names
        (:attr:`~capsule_lib.routing.kinds.RoutingKind.scores`: capsule lengths, probabilities or logits); ``None``
        for an algorithm whose outputs have none (Heinsen 2022, inverted attention).
    trace : RoutingTrace or None
        The routing's internals with ``return_routing=True``, else ``None``.
    """

    poses: torch.Tensor
    activations: torch.Tensor | None = None
    trace: RoutingTrace | None = None


@dataclass
class RoutingTrace:
    """Internals of one routing call, per iteration, for figures and widgets.

    Attributes
    ----------
    algorithm
        Name of the algorithm, its routing kind (:data:`~capsule_lib.routing.kinds.ROUTING_KINDS`: ``"dynamic"``,
        ``"em"``, ``"heinsen_2019"``, ``"heinsen_2022"``, ``"inverted"``, ``"self_attention"``).
    coefficients
        One tensor per iteration with the routing (coupling) coefficients used **in** that iteration,
        shaped ``[B, n_inp, n_out]`` (FC routing) or ``[B, ..., n_inp, n_out]``. They sum to 1 over the
        parent axis ``n_out`` (the last axis) for every algorithm except where documented.
    agreements
        One tensor per iteration with the agreement computed **after** that iteration's outputs (the
        quantity that updates the logits: dot products for dynamic routing, log-likelihoods for EM /
        Heinsen, scaled dot products for inverted attention). Same shape as ``coefficients``.
    outputs
        Output capsules after each iteration (poses), ``[B, n_out, d_out]``-like.
    activations
        Output activations/scores after each iteration where the algorithm has them (else empty).
    extra
        Algorithm-specific tensors (e.g. the self-attention matrix, variances ``sigma2``, D-step shares).
    """

    algorithm: str
    coefficients: list[torch.Tensor] = field(default_factory=list)
    agreements: list[torch.Tensor] = field(default_factory=list)
    outputs: list[torch.Tensor] = field(default_factory=list)
    activations: list[torch.Tensor] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def iterations(self) -> int:
        """The number of routing iterations recorded."""
        return len(self.coefficients)

    def detach(self) -> RoutingTrace:
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


@dataclass
class CapsuleOutput:
    """What every capsule classifier returns.

    Attributes
    ----------
    scores
        Class scores ``[B, K]``; what they are is named by ``kind``. The predicted class is
        ``scores.argmax(-1)`` for every kind.
    kind
        ``"lengths"`` (capsule lengths in [0, 1)), ``"activations"`` (EM activations in (0, 1)) or
        ``"logits"`` (unnormalised; use ``softmax`` for probabilities).
    poses
        Class capsules ``[B, K, D]`` (matrix poses flattened to ``D = 16``).
    reconstruction
        Decoder output ``[B, C, H, W]``, or ``None`` for models without a decoder.
    trace
        The :class:`RoutingTrace` of the class-capsule routing when asked for (``return_routing=True``).
    extra
        Model-specific tensors (per-layer activations, variances, other traces).
    """

    scores: torch.Tensor
    kind: ScoreKind
    poses: torch.Tensor
    reconstruction: torch.Tensor | None = None
    trace: RoutingTrace | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SCORE_KINDS:
            raise ValueError(f"CapsuleOutput.kind must be one of {SCORE_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class ImageContract:
    """The images a model reads, declared once per model (its ``input_contract`` property) and checked in one place
    (``capsule_lib._checks``: the shape by every ``forward``, the values by
    :func:`~capsule_lib.evaluation.predict`).

    Attributes
    ----------
    channels
        image channels ``C``.
    size
        height and width (square images), or ``None`` for any size.
    value_range
        the range of the float pixel values, ``(0, 1)`` for every model trained on ``uint8 / 255``; ``None`` for
        any finite values (standardised input). NaN and infinite pixels are always refused.
    """

    channels: int
    size: int | None
    value_range: tuple[float, float] | None = (0.0, 1.0)

    @property
    def spec(self) -> str:
        """The shape in words, ``"[B, 1, 28, 28]"``, as errors quote it."""
        s = self.size
        return f"[B, {self.channels}, {s or 'H'}, {s or 'W'}]"
