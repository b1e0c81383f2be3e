"""The names of the routing algorithms, one per algorithm, their papers' default numbers of iterations, and
:func:`build_routing`, which makes a fully connected layer of each (the comparison and :mod:`capsule_lib.cost`)."""

from __future__ import annotations

import math

from torch import nn

__all__ = ["ROUTING_KINDS", "DEFAULT_ITERATIONS", "build_routing"]

#: every routing algorithm of the library, by the name the comparison and :mod:`capsule_lib.cost` use
#: (:func:`capsule_lib.cost.routing_layer` builds each as a fully connected layer of capsules of size ``d``)
ROUTING_KINDS = {
    "dynamic": "dynamic routing (Sabour et al. 2017), one d x d matrix per pair",
    "em": "EM routing (Hinton et al. 2018), matrix capsules: one sqrt(d) x sqrt(d) matrix per pair",
    "heinsen_2019": "Heinsen (2019) generative matrix routing, d_cov = 1, one 1 x d -> 1 x d matrix per pair",
    "heinsen_2022": "Heinsen (2022) efficient vector routing (memory_efficient=True)",
    "inverted": "inverted dot-product attention (Tsai et al. 2020), one sqrt(d) x sqrt(d) matrix per pair",
    "self_attention": "self-attention routing (Mazzia et al. 2021), one d x d matrix per pair, no iterations",
}

#: each kind's default number of routing iterations (its paper's); ``None``: the algorithm does not iterate
DEFAULT_ITERATIONS = {
    "dynamic": 3,
    "em": 3,
    "heinsen_2019": 3,
    "heinsen_2022": 2,
    "inverted": 2,
    "self_attention": None,
}


def build_routing(kind: str, n_inp: int, n_out: int, d: int, iterations: int | None = None) -> nn.Module:
    """A fully connected routing layer of ``kind`` from ``n_inp`` to ``n_out`` capsules of size ``d``.

    ``inverted`` is one update per call (:class:`~capsule_lib.routing.inverted.InvertedFCCapsules`); its ``route``
    runs its ``iterations``.

    Parameters
    ----------
    kind : str
        One of :data:`ROUTING_KINDS`: ``"dynamic"``, ``"em"``, ``"heinsen_2019"``, ``"heinsen_2022"``,
        ``"inverted"``, ``"self_attention"`` (ValueError otherwise).
    n_inp, n_out : int
        Numbers of input and output capsules.
    d : int
        Capsule size, of inputs and outputs alike; a square (``4 x 4 = 16``) for ``em`` and ``inverted``, whose
        capsules are ``sqrt(d) x sqrt(d)`` matrices.
    iterations : int or None, optional
        Routing iterations; ``None`` (default): the kind's :data:`DEFAULT_ITERATIONS`. ``self_attention`` has
        none and refuses a number.

    Returns
    -------
    torch.nn.Module
        :class:`~capsule_lib.routing.dynamic.DynamicRouting`, :class:`~capsule_lib.routing.em.EMRouting`,
        :class:`~capsule_lib.routing.heinsen_2019.GenerativeMatrixRouting` (``d_cov = 1``),
        :class:`~capsule_lib.routing.heinsen_2022.EfficientVectorRouting`,
        :class:`~capsule_lib.routing.inverted.InvertedFCCapsules` or
        :class:`~capsule_lib.routing.self_attention.SelfAttentionRouting`.
    """
    from .dynamic import DynamicRouting
    from .em import EMRouting
    from .heinsen_2019 import GenerativeMatrixRouting
    from .heinsen_2022 import EfficientVectorRouting
    from .inverted import InvertedFCCapsules
    from .self_attention import SelfAttentionRouting

    if kind not in ROUTING_KINDS:
        raise ValueError(f"unknown routing kind {kind!r}; kinds: {', '.join(ROUTING_KINDS)}")
    if kind == "self_attention" and iterations is not None:
        raise ValueError("self_attention routing has no iterations (pass iterations=None)")
    if kind in ("em", "inverted") and math.isqrt(d) ** 2 != d:
        raise ValueError(f"{kind} routes matrix capsules: d must be a square (4 x 4 = 16), got {d}")
    T = DEFAULT_ITERATIONS[kind] if iterations is None else iterations
    if kind == "dynamic":
        return DynamicRouting(n_inp, n_out, d, d, T)
    if kind == "em":
        return EMRouting(n_inp, n_out, math.isqrt(d), T)
    if kind == "heinsen_2019":
        return GenerativeMatrixRouting(d_cov=1, d_inp=d, d_out=d, n_inp=n_inp, n_out=n_out, iterations=T)
    if kind == "heinsen_2022":
        return EfficientVectorRouting(n_inp, n_out, d, d, T)
    if kind == "inverted":
        return InvertedFCCapsules(n_inp, n_out, d, iterations=T)
    return SelfAttentionRouting(n_inp, n_out, d, d)
