"""One module per paper's models."""
from .capsnet import CapsNet, CapsNetConfig, CapsuleOutput

__all__ = ["CapsNet", "CapsNetConfig", "CapsuleOutput"]
