"""Every capsule layer that is not a routing algorithm, one kind per module.

================  ==========================================================================================
module            layers
================  ==========================================================================================
``primary``       primary capsules: :class:`PrimaryCapsules` (conv), :class:`DepthwisePrimaryCapsules`,
                  :class:`MatrixPrimaryCapsules`, :class:`InvertedPrimaryCapsules`
``matrix``        convolutional and class matrix capsules around EM routing: :class:`ConvCapsules`,
                  :class:`ClassCapsules`
``decoders``      reconstruction decoders: :class:`FCDecoder`, :class:`UpsampleConvDecoder`
``masking``       :func:`mask_capsules`, :class:`Mask`
``conv``          :class:`GemmConv2d` (a convolution with a faster bf16 path)
``routing_free``  the critics' capsules without routing: :class:`HomogeneousVectorCapsules` (Byerly et al.),
                  :class:`SharedTransformCapsules` (Gu & Tresp's AffCapsNets)
``stem``          :class:`ImageStem`: images of any side brought to the side a paper's network reads
                  (:func:`resize_images`)
================  ==========================================================================================

Routing algorithms (and the fully-connected layers that are nothing but an algorithm with its transformation
weights) live in :mod:`capsule_lib.routing`.
"""

from .conv import GemmConv2d, bf16_gemm_conv2d
from .decoders import FCDecoder, UpsampleConvDecoder
from .masking import Mask, mask_capsules
from .matrix import ClassCapsules, ConvCapsules, grid_centers
from .primary import DepthwisePrimaryCapsules, InvertedPrimaryCapsules, MatrixPrimaryCapsules, PrimaryCapsules
from .routing_free import HomogeneousVectorCapsules, SharedTransformCapsules
from .stem import ImageStem, resize_images

__all__ = [
    "GemmConv2d",
    "bf16_gemm_conv2d",
    "FCDecoder",
    "UpsampleConvDecoder",
    "Mask",
    "mask_capsules",
    "ClassCapsules",
    "ConvCapsules",
    "grid_centers",
    "DepthwisePrimaryCapsules",
    "InvertedPrimaryCapsules",
    "MatrixPrimaryCapsules",
    "PrimaryCapsules",
    "HomogeneousVectorCapsules",
    "SharedTransformCapsules",
    "ImageStem",
    "resize_images",
]
