"""Routing algorithms, one module each, called through one protocol and registered in one place (``kinds.py``).

Every algorithm's layer is built and called alike (:mod:`capsule_lib.routing.kinds`)::

    layer = build_routing("em", n_inp, n_out, d)              # ROUTING_KINDS["em"].layer.fully_connected(...)
    routed = layer.route(poses, activations, iterations=None, return_routing=False)   # a types.Routed
    routed.poses [B, n_out, d], routed.activations [B, n_out] or None, routed.trace
    layer.route(poses, activations, couplings="uniform")       # or "random": Paik et al.'s baselines, one pass

Each module opens with its algorithm's reference form (what the chapter shows), then the paper-shaped functional
form, then the layer, whose ``forward`` is the paper's own layer call (what the paper's models use) and whose
``route`` is the protocol.

=====================  ============================================  ==============================
module                 algorithm                                     main entry points
=====================  ============================================  ==============================
``dynamic``            Sabour et al. 2017, routing by agreement      ``dynamic_routing``, ``DynamicRouting``
``em``                 Hinton et al. 2018, EM routing (log space)    ``em_routing``, ``EMRouting``
``heinsen_2019``       Heinsen 2019, generative matrix routing       ``generative_matrix_routing``,
                                                                     ``GenerativeMatrixRouting``
``heinsen_2022``       Heinsen 2022, efficient vector routing        ``efficient_vector_routing``,
                                                                     ``EfficientVectorRouting``
``inverted``           Tsai et al. 2020, inverted dot-product attn   ``InvertedFCCapsules``, ``InvertedConvCapsules``
``self_attention``     Mazzia et al. 2021, self-attention routing    ``self_attention_routing``, ``FCCapsules``
=====================  ============================================  ==============================
"""

from ._common import fixed_couplings
from .dynamic import DynamicRouting, capsule_votes, dynamic_routing
from .em import EMRouting, EMRoutingBase, em_routing, inverse_temperature_schedule, matrix_votes
from .heinsen_2019 import GenerativeMatrixRouting, generative_matrix_routing, heinsen_votes
from .heinsen_2022 import EfficientVectorRouting, VectorRoutingWeights, efficient_vector_routing
from .inverted import (
    InvertedConvCapsules,
    InvertedFCCapsules,
    PoseNorm,
    inverted_attention_update,
    inverted_conv_update,
    inverted_fc_update,
)
from .self_attention import FCCapsules, SelfAttentionRouting, self_attention_routing, self_attention_votes

__all__ = [
    "fixed_couplings",
    "dynamic_routing",
    "DynamicRouting",
    "capsule_votes",
    "em_routing",
    "EMRouting",
    "EMRoutingBase",
    "inverse_temperature_schedule",
    "matrix_votes",
    "generative_matrix_routing",
    "GenerativeMatrixRouting",
    "heinsen_votes",
    "efficient_vector_routing",
    "EfficientVectorRouting",
    "VectorRoutingWeights",
    "inverted_attention_update",
    "inverted_fc_update",
    "inverted_conv_update",
    "PoseNorm",
    "InvertedFCCapsules",
    "InvertedConvCapsules",
    "self_attention_routing",
    "SelfAttentionRouting",
    "FCCapsules",
    "self_attention_votes",
]
