"""One network, six routings: the comparison chapter's controlled experiment.

Every :class:`RoutingClassifier` has the same convolutional stem and the same primary capsules; only the layer
that routes the primary capsules to the class capsules differs (``config.routing``, a key of
:data:`capsule_lib.routing.kinds.ROUTING_KINDS`), and with it the class signal its paper reads out and trains.
The network reads what differs from the routing's registry entry (:class:`~capsule_lib.routing.kinds.RoutingKind`:
the squash before it, the activations it takes, the scores it gives) and calls every routing through the one
protocol, ``route(poses, activations, iterations=..., return_routing=...)``; for the six registered kinds:

* ``dynamic``: :class:`~capsule_lib.routing.dynamic.DynamicRouting` on the squashed primary capsules; score:
  the class capsules' lengths, margin loss;
* ``self_attention``: :class:`~capsule_lib.routing.self_attention.SelfAttentionRouting` on primaries squashed
  with squash_E; lengths, margin loss;
* ``em``: :class:`~capsule_lib.routing.em.EMRouting` on 4x4 poses with sigmoid activations; the class
  activations, spread loss;
* ``heinsen_2019``: :class:`~capsule_lib.routing.heinsen_2019.GenerativeMatrixRouting` with the activation logits;
  its output activation logits, cross-entropy;
* ``heinsen_2022``: :class:`~capsule_lib.routing.heinsen_2022.EfficientVectorRouting`, then one linear readout shared
  by the classes; logits, cross-entropy;
* ``inverted``: :class:`~capsule_lib.routing.inverted.InvertedFCCapsules`, T updates, then the shared linear
  readout; logits, cross-entropy.

(:class:`~capsule_lib.losses.ScoreObjective` picks the loss from the score kind.) Shapes, for the default MNIST
configuration::

    x [B, 1, 28, 28] -> stem (conv 5x5, conv 3x3 stride 2) [B, 128, 12, 12]
      -> primary conv 3x3 stride 2 [B, T*(d+1), 6, 6] -> poses [B, N = T*6*6, d], activation logits [B, N]
      -> routing -> class capsules [B, K, d] and scores [B, K]

With ``hidden = (n_1, ..., n_h)`` (Mitterreiter et al. 2023's deeper stacks) the same routing first runs through
``h`` fully connected layers of hidden capsules, ``N -> n_1 -> ... -> n_h -> K``, each taking the previous layer's
poses and (for a routing that takes them) its output activations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from .._checks import check_choice, check_iterations, check_model_input
from .._contracts import check_fields
from ..functional import squash
from ..layers.routing_free import HomogeneousVectorCapsules, SharedTransformCapsules
from ..layers.stem import ImageStem
from ..routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS
from ..types import COUPLINGS, CapsuleOutput, ImageContract

__all__ = ["HEADS", "RoutingClassifierConfig", "RoutingClassifier"]

#: the layers a :class:`RoutingClassifier` can put between its primary and class capsules (``config.head``)
HEADS: tuple[str, ...] = ("routing", "hvc", "shared_transform", "aff_capsnet")


@dataclass
class RoutingClassifierConfig:
    """The comparison network's hyper-parameters (the defaults: the MNIST configuration).

    Attributes
    ----------
    routing : str
        A key of :data:`capsule_lib.routing.kinds.ROUTING_KINDS` (default ``"dynamic"``).
    iterations : int or None
        Routing iterations, >= 1; ``None`` (default) for the kind's default
        (:data:`capsule_lib.routing.kinds.DEFAULT_ITERATIONS`; ``self_attention`` takes none).
    in_channels : int
        Image channels (default 1).
    image_size : int
        Side of the square input images (default 28).
    n_classes : int
        Class capsules (default 10).
    stem_channels : tuple of int
        Channels of the stem's two convolutions (5x5, then 3x3 stride 2, ReLU) (default ``(64, 128)``).
    primary_types : int
        Primary capsule types on the grid left by a 3x3 stride-2 convolution (default 16).
    caps_dim : int
        Values per capsule, a square: EM and inverted routing use them as matrices (default 16).
    couplings : str
        ``"routed"`` (default): the routing's own couplings; ``"uniform"`` or ``"random"``: Paik et al.'s fixed
        couplings in one pass (:meth:`~capsule_lib.routing._common.RoutingProtocol.route`; ``iterations`` unused).
    head : str
        The layer between the primary and the class capsules: ``"routing"`` (default: ``routing`` with
        ``couplings``), or one of the critics' routing-free layers (:mod:`capsule_lib.layers.routing_free`; then
        ``routing`` is not read, and ``iterations`` and ``couplings`` must keep their defaults): ``"hvc"``,
        homogeneous vector capsules on the unsquashed primaries, their lengths as logits, cross-entropy (Byerly et
        al. 2021); ``"shared_transform"``, one transform per primary type (shared by its positions) on the squashed
        primaries, couplings ``1 / n_out``, squash, lengths, margin loss (the book's first reading of Gu & Tresp
        2020); ``"aff_capsnet"``, the same with one transform per class shared by every primary capsule, Gu &
        Tresp's Aff-CapsNets (:class:`~capsule_lib.layers.SharedTransformCapsules`, ``shared="all"``).
    hidden : tuple of int
        Capsules of each hidden routing layer between the primary and the class capsules, image side first, each
        routed like the class layer (default ``()``: none, the comparison network); a routing head only.
    hidden_init : str
        How the hidden routing layers start: ``"paper"`` (default), the routing's own initialisation (dynamic
        routing's ``N(0, 0.01^2)`` weights and 0.1 biases, made for a layer fed by a thousand capsules); ``"unit"``,
        weights ``N(0, 1)`` and biases 0 (the routing's ``unit_init_``,
        :meth:`~capsule_lib.routing.dynamic.DynamicRouting.unit_init_`), so that a hidden layer fed by a few capsules
        passes the image on instead of its biases: the remedy that lets a stack of dynamic routing layers learn
        (``benchmarks/learning_diagnostics.py depth``); a routing whose layer has it only.
    scaled_votes : bool
        Every routing layer's votes scaled to its fan-in (default ``False``, the paper's layers): the routing's
        ``scale_votes_`` (:meth:`~capsule_lib.routing.dynamic.DynamicRouting.scale_votes_`: effective weights
        ``N(0, 1)``, bias 0, each layer's weights trained ``n_out / n_inp`` times slower), the remedy that lets a
        stack of dynamic routing layers learn; a routing head whose layer has it only.
    stem_side : int or None
        The side an :class:`~capsule_lib.layers.ImageStem` brings the images to before the network's own stem
        (the convolutions, primary capsules and routing built for that side: ``stem_side=28``, 576 primary
        capsules, whatever the images' ``image_size``); ``None`` (default): no image stem.
    """

    routing: str = "dynamic"
    iterations: int | None = None
    in_channels: int = 1
    image_size: int = 28
    n_classes: int = 10
    stem_channels: tuple[int, int] = (64, 128)
    primary_types: int = 16
    caps_dim: int = 16
    couplings: str = "routed"
    head: str = "routing"
    hidden: tuple[int, ...] = ()
    hidden_init: str = "paper"
    scaled_votes: bool = False
    stem_side: int | None = None

    def __post_init__(self) -> None:
        check_fields(self)  # every field of the annotated type (one line naming it)
        for name, n in (("stem_channels", 2), ("hidden", None)):  # a config read back from JSON holds lists
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or (n is not None and len(value) != n):
                want = f"{n} channel counts" if n else "capsule counts"
                raise ValueError(
                    f"{name} must be a list of {want} (e.g. {[64, 128] if n else [32, 16]}), got {value!r}"
                )
            setattr(self, name, tuple(value))
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in self.stem_channels):
            raise ValueError(f"stem_channels must hold channel counts >= 1, got {self.stem_channels}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 2 for n in self.hidden):
            raise ValueError(f"hidden must hold capsule counts >= 2, got {self.hidden}")
        if self.hidden and self.head != "routing":
            raise ValueError(f"head {self.head!r} routes nothing: hidden routing layers need head='routing'")
        check_choice(self.routing, sorted(ROUTING_KINDS), "routing")
        if self.iterations is not None:
            check_iterations(self.iterations, "iterations (None: the routing's default)")
        if DEFAULT_ITERATIONS[self.routing] is None and self.iterations is not None:
            raise ValueError(f"{self.routing} routing has no iterations (leave iterations=None)")
        check_choice(self.couplings, COUPLINGS, "couplings")
        check_choice(self.head, HEADS, "head")
        if self.head != "routing" and (self.iterations is not None or self.couplings != "routed"):
            raise ValueError(f"head {self.head!r} routes nothing: leave iterations=None and couplings='routed'")
        check_choice(self.hidden_init, ("paper", "unit"), "hidden_init")
        if self.hidden_init != "paper" and not hasattr(ROUTING_KINDS[self.routing].layer, "unit_init_"):
            raise ValueError(
                f"hidden_init={self.hidden_init!r} needs a routing layer with unit_init_; {self.routing!r} has none"
            )
        if self.scaled_votes and (
            self.head != "routing" or not hasattr(ROUTING_KINDS[self.routing].layer, "scale_votes_")
        ):
            raise ValueError(
                f"scaled_votes needs a routing head whose layer scales its votes (scale_votes_); {self.routing!r} "
                f"with head {self.head!r} has none"
            )
        if int(self.caps_dim**0.5) ** 2 != self.caps_dim:
            raise ValueError(f"caps_dim must be a square (EM and inverted routing use matrices), got {self.caps_dim}")

    @property
    def grid(self) -> int:
        """The side of the primary capsules' grid (after a valid 5x5 convolution and two 3x3 stride-2 ones)."""
        s = (self.stem_side or self.image_size) - 4
        for _ in range(2):
            s = (s - 1) // 2 + 1
        return s

    @property
    def n_primary(self) -> int:
        return self.primary_types * self.grid**2

    @property
    def routing_iterations(self) -> int | None:
        if self.head != "routing":
            return None
        return DEFAULT_ITERATIONS[self.routing] if self.iterations is None else self.iterations

    def with_routing(self, routing: str, **overrides) -> RoutingClassifierConfig:
        """The same network with another routing (iterations back to that kind's default unless given).

        Parameters
        ----------
        routing : str
            A key of :data:`capsule_lib.routing.kinds.ROUTING_KINDS`.
        overrides
            Keyword arguments: other fields to change, ``iterations`` included.

        Returns
        -------
        RoutingClassifierConfig
            A new config.
        """
        return replace(self, routing=routing, iterations=overrides.pop("iterations", None), **overrides)


class RoutingClassifier(nn.Module):
    """Shared stem and primary capsules, then one routing layer to the class capsules (see the module docstring).

    ``forward(x, return_routing=False) -> CapsuleOutput`` with ``scores [B, K]`` of ``kind`` ``"lengths"``,
    ``"activations"`` or ``"logits"``, ``poses [B, K, d]``, and with ``return_routing`` the routing's trace
    (for ``inverted``, the last update's) and every routing layer's in ``extra["traces"]`` (image side first; one
    without ``config.hidden``). ``forward(x, iterations=T)`` overrides the number of iterations at
    test time (the comparison's iteration sweep).

    Parameters
    ----------
    config : RoutingClassifierConfig, optional
        The hyper-parameters; ``None`` (default) for ``RoutingClassifierConfig()`` (dynamic routing).
    overrides
        Keyword arguments: fields of the config to replace.
    """

    def __init__(self, config: RoutingClassifierConfig | None = None, **overrides) -> None:
        super().__init__()
        cfg = replace(config or RoutingClassifierConfig(), **overrides)
        self.config = cfg
        what, side = ("image_size", cfg.image_size) if cfg.stem_side is None else ("stem_side", cfg.stem_side)
        if side < 5:  # the stem's valid 5x5 convolution
            raise ValueError(f"{what} {side} is too small for the stem (a 5x5 convolution): at least 5")
        c1, c2 = cfg.stem_channels
        T, d, N, K = cfg.primary_types, cfg.caps_dim, cfg.n_primary, cfg.n_classes
        self.image_stem = ImageStem(cfg.in_channels, cfg.image_size, cfg.stem_side)  # the identity without stem_side
        self.stem = nn.Sequential(
            nn.Conv2d(self.image_stem.out_channels, c1, 5),
            nn.ReLU(inplace=True),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1),
            nn.ReLU(inplace=True),
        )
        self.primary = nn.Conv2d(c2, T * (d + 1), 3, stride=2, padding=1)  # d pose values + 1 activation per type
        self.kind = ROUTING_KINDS[cfg.routing]
        self.head = None  # a routing-free layer (config.head), else None
        if cfg.head == "hvc":
            self.head = HomogeneousVectorCapsules(N, K, d)
        elif cfg.head in ("shared_transform", "aff_capsnet"):
            self.head = SharedTransformCapsules(
                T, cfg.grid**2, K, d, d, shared="type" if cfg.head == "shared_transform" else "all"
            )
        sizes = (N, *cfg.hidden)  # each routing layer's input capsules, image side first
        self.hidden_layers = nn.ModuleList(self._routing_layer(n, m) for n, m in zip(sizes, sizes[1:]))
        if cfg.hidden_init == "unit":
            for layer in self.hidden_layers:
                layer.unit_init_()
        self.routing = self._routing_layer(sizes[-1], K) if self.head is None else None
        # a routing whose outputs have no activations (heinsen_2022, inverted): one linear readout shared by the classes
        self.readout = nn.Linear(d, 1) if self.kind.scores is None and self.head is None else None

    def _routing_layer(self, n_inp: int, n_out: int) -> nn.Module:
        """One routing layer ``n_inp -> n_out`` of the config's kind, iterations and couplings (votes scaled to its
        fan-in with ``scaled_votes``)."""
        cfg = self.config
        layer = self.kind.build(n_inp, n_out, cfg.caps_dim, cfg.iterations, cfg.couplings)
        return layer.scale_votes_() if cfg.scaled_votes else layer

    @property
    def input_contract(self) -> ImageContract:
        """Images ``[B, in_channels, image_size, image_size]`` in [0, 1] (``predict`` converts uint8)."""
        return ImageContract(self.config.in_channels, self.config.image_size)

    def primary_capsules(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The primary capsules of images, capsule ``i = (t*g + y)*g + x`` on the ``g x g`` grid.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images, unchecked (:meth:`forward` checks them).

        Returns
        -------
        tuple of torch.Tensor
            ``(poses [B, N, d], activation logits [B, N])``, ``N = primary_types * g * g``, ``d = caps_dim``.
        """
        cfg = self.config
        B = x.shape[0]
        T, d, g = cfg.primary_types, cfg.caps_dim, cfg.grid
        h = self.primary(self.stem(self.image_stem(x))).view(B, T, d + 1, g, g)  # [B, T, d+1, g, g]
        h = h.permute(0, 1, 3, 4, 2).reshape(B, T * g * g, d + 1)  # [B, N, d+1]
        return h[..., :d], h[..., d]  # [B, N, d], [B, N]

    def forward(
        self,
        x: torch.Tensor,
        return_routing: bool = False,
        iterations: int | None = None,
        couplings: str | None = None,
    ) -> CapsuleOutput:
        """Images -> class capsules.

        Parameters
        ----------
        x : torch.Tensor
            ``[B, in_channels, image_size, image_size]`` images in [0, 1].
        return_routing : bool, optional
            Also record the routing's :class:`~capsule_lib.types.RoutingTrace` (default ``False``).
        iterations : int, optional
            Routing iterations for this call, >= 1, passed to the routing layer for this call only (nothing about
            the layer changes); ``None`` (default) uses the config's. ``self_attention`` refuses a number.
        couplings : str, optional
            Couplings for this call (``"routed"``, ``"uniform"``, ``"random"``); ``None`` (default): the config's.

        Returns
        -------
        CapsuleOutput
            ``scores [B, K]`` of ``kind`` ``"lengths"`` (dynamic, self_attention), ``"activations"`` (em) or
            ``"logits"`` (heinsen_2019, heinsen_2022, inverted), ``poses [B, K, d]``, and with ``return_routing``
            the routing's trace (for ``inverted``, the last update's) and every routing layer's in
            ``extra["traces"]`` (image side first).
        """
        check_model_input(x, self)
        kind = self.kind
        T = None if iterations is None else check_iterations(iterations)
        poses, logits = self.primary_capsules(x)  # [B, N, d], [B, N]
        if self.head is not None:
            return self._routing_free(poses, return_routing, iterations, couplings)
        u = poses if kind.squash is None else kind.squash(poses)  # [B, N, d]
        a = kind.input_activations(logits)  # [B, N] or None
        traces = []
        for layer in (*self.hidden_layers, self.routing):  # [B, n, d] -> [B, m, d], image side first
            r = layer.route(u, a, iterations=T, return_routing=return_routing, couplings=couplings)
            u, a = r.poses, (r.activations if kind.activations is not None else None)  # the next layer's inputs
            traces.append(r.trace)
        extra = {"traces": traces} if return_routing else {}  # every routing layer's, image side first
        if self.readout is None:
            return CapsuleOutput(r.activations, kind.scores, r.poses, trace=r.trace, extra=extra)  # [B, K], [B, K, d]
        return CapsuleOutput(self.readout(r.poses).squeeze(-1), "logits", r.poses, trace=r.trace, extra=extra)

    def _routing_free(self, poses: torch.Tensor, return_routing: bool, iterations, couplings) -> CapsuleOutput:
        """The routing-free heads: primaries ``[B, N, d]`` -> class capsules ``[B, K, d]`` and their scores."""
        if return_routing or iterations is not None or couplings not in (None, "routed"):
            raise ValueError(f"head {self.config.head!r} has no routing: no trace, iterations or couplings to set")
        if self.config.head == "hvc":
            v = self.head(poses)  # [B, K, d] on the unsquashed primaries
            return CapsuleOutput(self.head.scores(v), "logits", v)  # lengths read as logits (the authors')
        v = self.head(squash(poses, "hinton"))  # [B, K, d], as dynamic routing's primaries
        return CapsuleOutput(self.head.scores(v), "lengths", v)
