"""One module per paper's models; each takes a dataclass config whose defaults are the paper's."""

from .baselines import BaselineCNN, BaselineCNNConfig
from .capsnet import CapsNet, CapsNetConfig
from .efficient import EfficientCapsNet, EfficientCapsNetConfig
from .em_capsnet import EMCapsNet, EMCapsNetConfig
from .heinsen import (
    SequenceClassifierConfig,
    SequenceClassifierHead,
    SmallNORBClassifier,
    SmallNORBConfig,
    TokenSequenceClassifier,
    TokenSequenceConfig,
)
from .inverted import BackboneClassifier, CapsLayerSpec, CapsModel, CapsModelConfig
from .registry import MODELS, build_model
from .routing_classifier import RoutingClassifier, RoutingClassifierConfig

__all__ = [
    "CapsNet",
    "CapsNetConfig",
    "EfficientCapsNet",
    "EfficientCapsNetConfig",
    "EMCapsNet",
    "EMCapsNetConfig",
    "SmallNORBClassifier",
    "SmallNORBConfig",
    "SequenceClassifierHead",
    "SequenceClassifierConfig",
    "TokenSequenceClassifier",
    "TokenSequenceConfig",
    "CapsModel",
    "CapsModelConfig",
    "CapsLayerSpec",
    "BackboneClassifier",
    "RoutingClassifier",
    "RoutingClassifierConfig",
    "BaselineCNN",
    "BaselineCNNConfig",
    "MODELS",
    "build_model",
]
