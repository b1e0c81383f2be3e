"""The one model registry: every model of the library by its kind, the name a recipe trains it under
(:attr:`~capsule_lib.train.recipes.base.Recipe.model_kind`) and a shipped checkpoint records (``"model"`` in
``registry.json``), with its config class; :func:`build_model` makes one from a config (a dataclass or the dict
a run's history or a registry entry holds)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

from torch import nn

from .baselines import BaselineCNN, BaselineCNNConfig
from .capsnet import CapsNet, CapsNetConfig
from .efficient import EfficientCapsNet, EfficientCapsNetConfig
from .em_capsnet import EMCapsNet, EMCapsNetConfig
from .heinsen import SmallNORBClassifier, SmallNORBConfig, TokenSequenceClassifier, TokenSequenceConfig
from .inverted import BackboneClassifier, CapsModel, CapsModelConfig
from .routing_classifier import RoutingClassifier, RoutingClassifierConfig

__all__ = ["MODELS", "build_model", "config_from_dict"]

#: model kind -> (model class, config class)
MODELS: dict[str, tuple[type[nn.Module], type]] = {
    "capsnet": (CapsNet, CapsNetConfig),
    "baseline_cnn": (BaselineCNN, BaselineCNNConfig),
    "efficient_capsnet": (EfficientCapsNet, EfficientCapsNetConfig),
    "em_capsnet": (EMCapsNet, EMCapsNetConfig),
    "heinsen_smallnorb": (SmallNORBClassifier, SmallNORBConfig),
    "token_sequences": (TokenSequenceClassifier, TokenSequenceConfig),
    "caps_model": (CapsModel, CapsModelConfig),  # Tsai et al.
    "backbone_classifier": (BackboneClassifier, CapsModelConfig),  # its backbone + a linear head
    "routing_classifier": (RoutingClassifier, RoutingClassifierConfig),  # the comparison's network
}


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """``cls(**d)`` for the keys that are fields of ``cls`` (others ignored), JSON lists back to tuples.

    Parameters
    ----------
    cls : type
        A config dataclass.
    d : dict[str, Any]
        Field values, e.g. a config read back from JSON (lists become tuples).

    Returns
    -------
    Any
        The config, ``cls(**fields)``.
    """
    names = {f.name for f in fields(cls)}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})


def build_model(kind: str, config: Any) -> nn.Module:
    """A model of ``kind`` from its config.

    Parameters
    ----------
    kind : str
        A key of :data:`MODELS`; any other raises ``ValueError``.
    config : Any
        A config dataclass (used as it is), or a dict of its fields (unknown keys are ignored,
        :func:`config_from_dict`).

    Returns
    -------
    nn.Module
        The model, built with that config.
    """
    if kind not in MODELS:
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(MODELS)}")
    model_cls, config_cls = MODELS[kind]
    return model_cls(config if is_dataclass(config) else config_from_dict(config_cls, config))
