"""The one model registry: every model of the library by its kind, the name a recipe trains it under
(:attr:`~capsule_lib.train.recipes.base.Recipe.model_kind`) and a shipped checkpoint records (``"model"`` in
``registry.json``), with its config class; :func:`build_model` makes one from a config (a dataclass or the dict
a run's history or a registry entry holds)."""

from __future__ import annotations

import math
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

__all__ = ["MODELS", "build_model", "config_from_dict", "smallest_image_size", "network_facts"]

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
    doubling and bisection. A config with a ``stem_side`` reads any side (1: its
    :class:`~capsule_lib.layers.ImageStem` resizes the images to ``stem_side``).

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


@checked
def network_facts(model: nn.Module) -> dict[str, Any]:
    """What a network became: its size, its primary capsules and its image stem (the command line's one line about
    the network a recipe built for the reader's images).

    The primary capsules are counted on the output of one forward pass of a blank image (in evaluation mode, without
    gradients; the model's mode, weights and random state are left as they were): ``primary_capsules(x)`` where the
    model has it (``[B, N, d]``, or ``[B, types, h, w, d]``: every axis but the batch and the pose), Heinsen's
    ``part_capsules``, else the output of its ``primary_caps`` layer (EM); 0 for a network without capsules (the CNN
    baselines).

    Parameters
    ----------
    model : nn.Module
        An image model of :data:`MODELS` (one with an ``input_contract``).

    Returns
    -------
    dict[str, Any]
        ``parameters`` (all of them), ``primary_capsules`` (``None`` for a model that reads no images) and
        ``stem`` (its :class:`~capsule_lib.layers.ImageStem` in words, ``None`` without one or when it is the
        identity).
    """
    stem = getattr(model, "image_stem", None)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "primary_capsules": _primary_capsules(model),
        "stem": stem.describe() if stem is not None else None,
    }


def _primary_capsules(model: nn.Module) -> int | None:
    """The number of primary capsules of one blank image (see :func:`network_facts`)."""
    contract = getattr(model, "input_contract", None)
    layer = getattr(model, "primary_caps", None)
    if contract is None or contract.size is None:
        return None
    if not any(hasattr(model, name) for name in ("primary_capsules", "part_capsules", "primary_caps")):
        return 0  # no capsules: a CNN
    p = next(model.parameters())
    x = torch.zeros(1, contract.channels, contract.size, contract.size, device=p.device, dtype=p.dtype)
    seen: list[torch.Tensor] = []
    was_training = model.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model.eval()
        try:
            if hasattr(model, "part_capsules"):  # Heinsen's (activation logits [B, N], poses [B, N, P, P])
                return model.part_capsules(x)[0].shape[1]
            if hasattr(model, "primary_capsules"):
                seen.append(model.primary_capsules(x))
            else:
                hook = layer.register_forward_hook(lambda m, i, out: seen.append(out))
                try:
                    model(x)
                finally:
                    hook.remove()
        finally:
            model.train(was_training)
    poses = seen[0][0] if isinstance(seen[0], tuple) else seen[0]  # (poses, activations) or poses
    return math.prod(poses.shape[1:-1])
