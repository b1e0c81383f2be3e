"""capsule_lib: capsule networks and their routing algorithms, faithful, inspectable and tested."""
from .functional import Length, SafeNorm, Squash, capsule_lengths, safe_norm, squash, squash_efficient, squash_hinton
from .layers import DepthwisePrimaryCapsules, FCDecoder, Mask, PrimaryCapsules, mask_capsules
from .losses import (MarginLoss, ReconstructionLoss, SoftTargetCrossEntropy, SpreadLoss, margin_loss,
                     reconstruction_loss, soft_target_cross_entropy, spread_loss, spread_margin)
from .models import CapsNet, CapsNetConfig, CapsuleOutput
from .routing import DynamicRouting, RoutingTrace, dynamic_routing

__version__ = "0.1.0"

__all__ = [
    "Length", "SafeNorm", "Squash", "capsule_lengths", "safe_norm", "squash", "squash_efficient", "squash_hinton",
    "DepthwisePrimaryCapsules", "FCDecoder", "Mask", "PrimaryCapsules", "mask_capsules",
    "MarginLoss", "ReconstructionLoss", "SoftTargetCrossEntropy", "SpreadLoss", "margin_loss",
    "reconstruction_loss", "soft_target_cross_entropy", "spread_loss", "spread_margin",
    "CapsNet", "CapsNetConfig", "CapsuleOutput", "DynamicRouting", "RoutingTrace", "dynamic_routing",
]
