"""capsule_lib: capsule networks and their routing algorithms, faithful, inspectable and tested.

Layers, bottom to top (each imports only from the ones above it in this list):
:mod:`capsule_lib.types` (:class:`CapsuleOutput`, :class:`RoutingTrace`, :class:`ImageContract`, constants),
:mod:`capsule_lib.functional` (squash, norms), :mod:`capsule_lib.losses`, :mod:`capsule_lib.routing` (one
module per algorithm, same calling convention, same trace), :mod:`capsule_lib.layers` (primary, matrix and
class capsules, decoders, masking), :mod:`capsule_lib.models` (one module per paper), :mod:`capsule_lib.data`
(``get_dataset``: real datasets or generated stand-ins, loaders), ``capsule_lib.train`` (the papers'
recipes, the ``Trainer``, ``train(recipe)`` and the command line), :mod:`capsule_lib.pretrained` (shipped
checkpoints), :mod:`capsule_lib.analysis` (what the figures show: sweeps, traces, model runs),
:mod:`capsule_lib.viz` (figures and widgets: they draw, analysis computes), :mod:`capsule_lib.notebook` (a chapter's
settings; the one reader of the ``CAPSULE_*`` environment variables).
"""

from . import models
from .functional import Length, SafeNorm, Squash, capsule_lengths, safe_norm, squash, squash_efficient, squash_hinton
from .layers import (
    ClassCapsules,
    ConvCapsules,
    DepthwisePrimaryCapsules,
    FCDecoder,
    InvertedPrimaryCapsules,
    Mask,
    MatrixPrimaryCapsules,
    PrimaryCapsules,
    UpsampleConvDecoder,
    mask_capsules,
)
from .losses import (
    MarginLoss,
    ReconstructionLoss,
    SoftTargetCrossEntropy,
    SpreadLoss,
    margin_loss,
    reconstruction_loss,
    soft_target_cross_entropy,
    spread_loss,
    spread_margin,
)
from .models import *  # noqa: F403  (every model and its config)
from .routing import (
    DynamicRouting,
    EfficientVectorRouting,
    EMRouting,
    FCCapsules,
    GenerativeMatrixRouting,
    InvertedConvCapsules,
    InvertedFCCapsules,
    SelfAttentionRouting,
    dynamic_routing,
    efficient_vector_routing,
    em_routing,
    generative_matrix_routing,
    self_attention_routing,
)
from .types import CapsuleOutput, ImageContract, RoutingTrace

__version__ = "0.1.0"

__all__ = [
    "CapsuleOutput",
    "ImageContract",
    "RoutingTrace",
    "Length",
    "SafeNorm",
    "Squash",
    "capsule_lengths",
    "safe_norm",
    "squash",
    "squash_efficient",
    "squash_hinton",
    "ClassCapsules",
    "ConvCapsules",
    "DepthwisePrimaryCapsules",
    "FCDecoder",
    "InvertedPrimaryCapsules",
    "Mask",
    "MatrixPrimaryCapsules",
    "PrimaryCapsules",
    "UpsampleConvDecoder",
    "mask_capsules",
    "MarginLoss",
    "ReconstructionLoss",
    "SoftTargetCrossEntropy",
    "SpreadLoss",
    "margin_loss",
    "reconstruction_loss",
    "soft_target_cross_entropy",
    "spread_loss",
    "spread_margin",
    *models.__all__,
    "dynamic_routing",
    "DynamicRouting",
    "em_routing",
    "EMRouting",
    "generative_matrix_routing",
    "GenerativeMatrixRouting",
    "efficient_vector_routing",
    "EfficientVectorRouting",
    "InvertedFCCapsules",
    "InvertedConvCapsules",
    "self_attention_routing",
    "SelfAttentionRouting",
    "FCCapsules",
]
