"""Routing algorithms, one module each, with the same calling convention and the same trace object.

=====================  ==========================================  ==============================
module                 algorithm                                   main entry points
=====================  ==========================================  ==============================
``dynamic``            Sabour et al. 2017, routing by agreement     ``dynamic_routing``, ``DynamicRouting``
``em``                 Hinton et al. 2018, EM routing (log space)   ``em_routing``, ``EMRouting``
``heinsen``            Heinsen 2019 / 2022                          ``generative_matrix_routing``, ``EfficientVectorRouting``
``inverted``           Tsai et al. 2020, inverted dot-product attn  ``InvertedFCCapsules``, ``InvertedConvCapsules``
``self_attention``     Mazzia et al. 2021, self-attention routing   ``self_attention_routing``, ``FCCapsules``
=====================  ==========================================  ==============================
"""
from .dynamic import DynamicRouting, capsule_votes, dynamic_routing
from .em import ClassCapsules, ConvCapsules, EMRouting, MatrixPrimaryCapsules, em_routing, inverse_temperature_schedule
from .heinsen import (EfficientVectorRouting, GenerativeMatrixRouting, efficient_vector_routing,
                      generative_matrix_routing, heinsen_votes)
from .inverted import (InvertedConvCapsules, InvertedFCCapsules, inverted_attention_update, inverted_conv_update,
                       inverted_fc_update)
from .self_attention import FCCapsules, SelfAttentionRouting, self_attention_routing, self_attention_votes
from .trace import RoutingTrace

__all__ = [
    "RoutingTrace",
    "dynamic_routing", "DynamicRouting", "capsule_votes",
    "em_routing", "EMRouting", "inverse_temperature_schedule", "MatrixPrimaryCapsules", "ConvCapsules", "ClassCapsules",
    "generative_matrix_routing", "GenerativeMatrixRouting", "heinsen_votes", "efficient_vector_routing",
    "EfficientVectorRouting",
    "inverted_attention_update", "inverted_fc_update", "inverted_conv_update", "InvertedFCCapsules",
    "InvertedConvCapsules",
    "self_attention_routing", "SelfAttentionRouting", "FCCapsules", "self_attention_votes",
]
