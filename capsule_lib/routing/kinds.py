"""The names of the routing algorithms, one per algorithm, and their papers' default numbers of iterations."""

from __future__ import annotations

__all__ = ["ROUTING_KINDS", "DEFAULT_ITERATIONS"]

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
