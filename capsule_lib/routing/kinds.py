"""The registry of routing algorithms: one :class:`RoutingKind` per algorithm, by the one name the comparison, the
traces and :mod:`capsule_lib.cost` use.

Every registered layer follows one protocol::

    layer = kind.layer.fully_connected(n_inp, n_out, d, iterations)     # n_inp -> n_out capsules of size d
    routed = layer.route(poses, activations=None, *, iterations=None, return_routing=False, couplings=None)
    routed.poses [B, n_out, d], routed.activations [B, n_out] or None, routed.trace   # a types.Routed

``poses`` are ``[B, n_inp, d]`` (matrix capsules flattened), ``activations`` ``[B, n_inp]`` on the scale the entry's
:attr:`RoutingKind.activations` names (``None`` for an algorithm that takes none). Code that runs any routing
(:class:`~capsule_lib.models.routing_classifier.RoutingClassifier`, :func:`capsule_lib.cost.routing_layer`) reads
what differs from the entry, never from the name. Adding an algorithm: one module in ``routing/`` whose layer has
``fully_connected``, ``route`` (the protocol's ``_routed`` and ``_coupled`` behind it), and one
:func:`register_routing` line below.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .._checks import check_choice
from ..functional import squash_efficient, squash_hinton
from ..types import COUPLINGS
from .dynamic import DynamicRouting
from .em import EMRouting
from .heinsen_2019 import GenerativeMatrixRouting
from .heinsen_2022 import EfficientVectorRouting
from .inverted import InvertedFCCapsules
from .self_attention import SelfAttentionRouting

__all__ = ["RoutingKind", "ROUTING_KINDS", "DEFAULT_ITERATIONS", "register_routing", "routing_kind", "build_routing"]


@dataclass(frozen=True)
class RoutingKind:
    """One routing algorithm of the registry: its layer and what a caller needs to know to run it.

    Attributes
    ----------
    name : str
        The algorithm's one name (its module in ``routing/``, its traces' ``algorithm``).
    layer : type
        The ``nn.Module`` class; it has ``fully_connected(n_inp, n_out, d, iterations)`` and the protocol's ``route``.
    iterations : int or None
        The paper's default number of routing iterations; ``None``: the algorithm does not iterate.
    description : str
        One line: the algorithm, its paper and its transformation per pair (the comparison's table).
    square : bool
        Whether ``d`` must be a square (capsules are ``sqrt(d) x sqrt(d)`` matrices).
    squash : callable or None
        What the comparison network applies to its primary poses before this routing (``None``: nothing).
    activations : str or None
        The scale of the input activations ``route`` takes, ``"probabilities"`` or ``"logits"``; ``None``: it takes
        none (and refuses them).
    scores : str or None
        The kind (:data:`~capsule_lib.types.SCORE_KINDS`: ``"lengths"``, ``"activations"``, ``"logits"``) of the output
        activations ``route`` returns; ``None``: the outputs have none (a classifier reads its scores out of the poses).
    """

    name: str
    layer: type[nn.Module]
    iterations: int | None
    description: str
    square: bool = False
    squash: Callable[[torch.Tensor], torch.Tensor] | None = None
    activations: Literal["probabilities", "logits"] | None = None
    scores: Literal["lengths", "activations", "logits"] | None = None

    def input_activations(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The activations this routing takes, from activation logits ``[B, n_inp]`` (``None`` if it takes none)."""
        if self.activations is None:
            return None
        return torch.sigmoid(logits) if self.activations == "probabilities" else logits

    def build(
        self, n_inp: int, n_out: int, d: int, iterations: int | None = None, couplings: str = "routed"
    ) -> nn.Module:
        """A fully connected layer from ``n_inp`` to ``n_out`` capsules of size ``d`` (see :func:`build_routing`)."""
        if self.iterations is None and iterations is not None:
            raise ValueError(f"{self.name} routing has no iterations (pass iterations=None)")
        if self.square and math.isqrt(d) ** 2 != d:
            raise ValueError(f"{self.name} routes matrix capsules: d must be a square (4 x 4 = 16), got {d}")
        check_choice(couplings, COUPLINGS, "couplings")
        layer = self.layer.fully_connected(n_inp, n_out, d, self.iterations if iterations is None else iterations)
        layer.couplings = couplings
        return layer


#: every routing algorithm of the library, by name (:func:`register_routing` adds one)
ROUTING_KINDS: dict[str, RoutingKind] = {}


def register_routing(kind: RoutingKind) -> RoutingKind:
    """Add ``kind`` to :data:`ROUTING_KINDS` (ValueError if its name is taken, or its layer lacks the protocol).

    Parameters
    ----------
    kind : RoutingKind
        The algorithm to register.

    Returns
    -------
    RoutingKind
        ``kind``.
    """
    if kind.name in ROUTING_KINDS:
        raise ValueError(f"routing kind {kind.name!r} is already registered")
    missing = [m for m in ("fully_connected", "route", "_coupled") if not callable(getattr(kind.layer, m, None))]
    if missing:
        names = ", ".join(missing[:-1]) + (" and " if len(missing) > 1 else "") + missing[-1]
        raise ValueError(f"{kind.layer.__name__} lacks the routing protocol's {names}")
    ROUTING_KINDS[kind.name] = kind
    kind.layer.algorithm = kind.name  # the name of its fixed-coupling traces (the protocol's ``route``)
    return kind


# fmt: off
register_routing(RoutingKind("dynamic", DynamicRouting, 3, "dynamic routing (Sabour et al. 2017), one d x d matrix per pair", squash=squash_hinton, scores="lengths"))  # noqa: E501
register_routing(RoutingKind("em", EMRouting, 3, "EM routing (Hinton et al. 2018), matrix capsules: one sqrt(d) x sqrt(d) matrix per pair", square=True, activations="probabilities", scores="activations"))  # noqa: E501
register_routing(RoutingKind("heinsen_2019", GenerativeMatrixRouting, 3, "Heinsen (2019) generative matrix routing, d_cov = 1, one 1 x d -> 1 x d matrix per pair", activations="logits", scores="logits"))  # noqa: E501
register_routing(RoutingKind("heinsen_2022", EfficientVectorRouting, 2, "Heinsen (2022) efficient vector routing (memory_efficient=True)"))  # noqa: E501
register_routing(RoutingKind("inverted", InvertedFCCapsules, 2, "inverted dot-product attention (Tsai et al. 2020), one sqrt(d) x sqrt(d) matrix per pair", square=True))  # noqa: E501
register_routing(RoutingKind("self_attention", SelfAttentionRouting, None, "self-attention routing (Mazzia et al. 2021), one d x d matrix per pair, no iterations", squash=squash_efficient, scores="lengths"))  # noqa: E501
# fmt: on


class _DefaultIterations(Mapping):
    """Each registered kind's default number of routing iterations, read from :data:`ROUTING_KINDS`."""

    def __getitem__(self, name: str) -> int | None:
        return ROUTING_KINDS[name].iterations

    def __iter__(self) -> Iterator[str]:
        return iter(ROUTING_KINDS)

    def __len__(self) -> int:
        return len(ROUTING_KINDS)


#: each kind's default number of routing iterations (its paper's); ``None``: the algorithm does not iterate
DEFAULT_ITERATIONS: Mapping[str, int | None] = _DefaultIterations()


def build_routing(
    kind: str, n_inp: int, n_out: int, d: int, iterations: int | None = None, couplings: str = "routed"
) -> nn.Module:
    """A fully connected routing layer of ``kind`` from ``n_inp`` to ``n_out`` capsules of size ``d``.

    Parameters
    ----------
    kind : str
        A key of :data:`ROUTING_KINDS` (ValueError otherwise).
    n_inp, n_out : int
        Numbers of input and output capsules.
    d : int
        Capsule size, of inputs and outputs alike; a square (``4 x 4 = 16``) for a kind with ``square``.
    iterations : int or None, optional
        Routing iterations; ``None`` (default): the kind's :data:`DEFAULT_ITERATIONS`. A kind that does not iterate
        refuses a number.
    couplings : str, optional
        The layer's couplings (:data:`~capsule_lib.types.COUPLINGS`): ``"routed"`` (default, the algorithm's),
        ``"uniform"`` or ``"random"`` (Paik et al.'s baselines: fixed couplings, one pass; ``iterations`` unused).

    Returns
    -------
    torch.nn.Module
        The kind's layer (``ROUTING_KINDS[kind].layer``), called through its ``route``.
    """
    return routing_kind(kind).build(n_inp, n_out, d, iterations, couplings)


def routing_kind(name: str) -> RoutingKind:
    """The registry entry of ``name`` (ValueError naming the registered kinds if there is none).

    Parameters
    ----------
    name : str
        A routing kind's name.

    Returns
    -------
    RoutingKind
        ``ROUTING_KINDS[name]``.
    """
    if name not in ROUTING_KINDS:
        raise ValueError(f"unknown routing kind {name!r}; kinds: {', '.join(ROUTING_KINDS)}")
    return ROUTING_KINDS[name]
