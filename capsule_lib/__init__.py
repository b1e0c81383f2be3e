"""capsule_lib: capsule networks and their routing algorithms, faithful, inspectable and tested.

Sub-packages: :mod:`capsule_lib.routing` (one module per algorithm, same calling convention, same
:class:`RoutingTrace`), :mod:`capsule_lib.models` (one module per paper), :mod:`capsule_lib.data`
(``get_dataset`` for real and generated datasets), :mod:`capsule_lib.training` (``Trainer``),
:mod:`capsule_lib.recipes` (the papers' training recipes), :mod:`capsule_lib.pretrained` (shipped
checkpoints), :mod:`capsule_lib.viz` (figures and widgets).
"""
from .functional import Length, SafeNorm, Squash, capsule_lengths, safe_norm, squash, squash_efficient, squash_hinton
from .layers import DepthwisePrimaryCapsules, FCDecoder, Mask, PrimaryCapsules, mask_capsules
from .losses import (MarginLoss, ReconstructionLoss, SoftTargetCrossEntropy, SpreadLoss, margin_loss,
                     reconstruction_loss, soft_target_cross_entropy, spread_loss, spread_margin)
from .models import (BaselineCNN, BaselineCNNConfig, CapsModel, CapsModelConfig, CapsNet, CapsNetConfig, CapsuleOutput,
                     EfficientCapsNet, EfficientCapsNetConfig, EMCapsNet, EMCapsNetConfig, SequenceClassifierHead,
                     SmallNORBClassifier)
from .routing import (ClassCapsules, ConvCapsules, DynamicRouting, EfficientVectorRouting, EMRouting, FCCapsules,
                      GenerativeMatrixRouting, InvertedConvCapsules, InvertedFCCapsules, RoutingTrace,
                      SelfAttentionRouting, dynamic_routing, efficient_vector_routing, em_routing,
                      generative_matrix_routing, self_attention_routing)

__version__ = "0.1.0"

__all__ = [
    "Length", "SafeNorm", "Squash", "capsule_lengths", "safe_norm", "squash", "squash_efficient", "squash_hinton",
    "DepthwisePrimaryCapsules", "FCDecoder", "Mask", "PrimaryCapsules", "mask_capsules",
    "MarginLoss", "ReconstructionLoss", "SoftTargetCrossEntropy", "SpreadLoss", "margin_loss",
    "reconstruction_loss", "soft_target_cross_entropy", "spread_loss", "spread_margin",
    "CapsuleOutput", "CapsNet", "CapsNetConfig", "EfficientCapsNet", "EfficientCapsNetConfig", "EMCapsNet",
    "EMCapsNetConfig", "SmallNORBClassifier", "SequenceClassifierHead", "CapsModel", "CapsModelConfig",
    "BaselineCNN", "BaselineCNNConfig",
    "RoutingTrace", "dynamic_routing", "DynamicRouting", "em_routing", "EMRouting", "ConvCapsules", "ClassCapsules",
    "generative_matrix_routing", "GenerativeMatrixRouting", "efficient_vector_routing", "EfficientVectorRouting",
    "InvertedFCCapsules", "InvertedConvCapsules", "self_attention_routing", "SelfAttentionRouting", "FCCapsules",
]
