"""The one model registry: every model of the library by its kind, the name a recipe trains it under
(:attr:`~capsule_lib.train.recipes.base.Recipe.model_kind`) and a shipped checkpoint records (``"model"`` in
``registry.json``), with its config class; :func:`build_model` makes one from a config (a dataclass or the dict
a run's history or a registry entry holds)."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from typing import Any

import torch
from torch import nn

from .._contracts import checked
from .baselines import BaselineCNN, BaselineCNNConfig
from .capsnet import CapsNet, CapsNetConfig
from .efficient import EfficientCapsNet, EfficientCapsNetConfig
from .em_capsnet import EMCapsNet, EMCapsNetConfig
from .heinsen import SmallNORBClassifier, SmallNORBConfig, TokenSequenceClassifier, TokenSequenceConfig
from .inverted import BackboneClassifier, CapsModel, CapsModelConfig
from .routing_classifier import RoutingClassifier, RoutingClassifierConfig

__all__ = ["MODELS", "build_model", "config_from_dict", "smallest_image_size"]

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


@checked
def smallest_image_size(kind: str, config: Any, largest: int = 1024) -> int | None:
    """The smallest image side a model of ``kind`` with ``config`` (all but its ``image_size``) can read: the
    smallest ``image_size`` its constructor accepts (each model refuses, in one line, a side its convolutions and
    capsule grids cannot read). Models are built on the ``meta`` device (no memory, no weights), the side found by
    doubling and bisection.

    Parameters
    ----------
    kind : str
        A key of :data:`MODELS`.
    config : Any
        Its config dataclass (with an ``image_size`` field).
    largest : int
        The largest side tried.

    Returns
    -------
    int or None
        The smallest side; ``None`` when even ``largest`` is refused.
    """

    def reads(side: int) -> bool:
        try:
            with torch.device("meta"):
                build_model(kind, replace(config, image_size=side))
        except ValueError:
            return False
        return True

    hi = 1
    while not reads(hi):  # doubling, then bisection: a few small models built
        if hi >= largest:
            return None
        hi = min(2 * hi, largest)
    lo = hi // 2  # refused (or 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reads(mid) else (mid, hi)
    return hi
