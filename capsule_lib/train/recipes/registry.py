"""The recipe registry: :data:`RECIPES` (every recipe by name) and :func:`make_recipe` /
:func:`recipe_config`, which build one with overrides (checked before any data is loaded)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ..._contracts import checked
from .base import Recipe
from .cifar import BackboneCifarCPURecipe, TsaiCifarCPURecipe, TsaiCifarRecipe
from .comparison import RoutingCompareNorbRecipe, RoutingCompareRecipe
from .mnist import (
    BaselineCNNRecipe,
    CapsNetMultiMNISTRecipe,
    CapsNetRecipe,
    EfficientCapsNetRecipe,
    EfficientMultiMNISTRecipe,
)
from .sequences import HeinsenSequenceRecipe
from .speedrun import SPEEDRUNS
from .viewpoints import (
    EMNorbRecipe,
    HeinsenNorbRecipe,
    NorbCNN48Recipe,
    NorbCNNRecipe,
)

__all__ = ["RECIPES", "make_recipe", "recipe_config"]

#: every recipe by name
RECIPES: dict[str, type[Recipe]] = {
    cls.name: cls
    for cls in (
        CapsNetRecipe,
        BaselineCNNRecipe,
        EfficientCapsNetRecipe,
        EfficientMultiMNISTRecipe,
        CapsNetMultiMNISTRecipe,
        EMNorbRecipe,
        NorbCNNRecipe,
        HeinsenNorbRecipe,
        NorbCNN48Recipe,
        HeinsenSequenceRecipe,
        TsaiCifarRecipe,
        TsaiCifarCPURecipe,
        BackboneCifarCPURecipe,
        RoutingCompareRecipe,
        RoutingCompareNorbRecipe,
        *SPEEDRUNS,
    )
}


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


#: plain annotations whose values :func:`_check_type` checks (others, e.g. nested configs, are left to their class)
_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(owner: str, key: str, annotation: str, value: Any) -> None:
    """One line when ``value`` does not fit a field annotated ``annotation`` (``int``, ``float | None``,
    ``tuple[int, ...]``...): a command-line typo (``epochs=abc``, ``lr=fast``, ``epochs=1.5``) is refused before any
    data is loaded instead of failing deep inside training."""
    optional = annotation.endswith("|None")
    base = annotation.removesuffix("|None")
    if value is None:
        if not optional:
            raise ValueError(f"{owner}.{key} cannot be None (expected {base})")
        return
    if base in _SCALARS:
        ok = isinstance(value, _SCALARS[base]) and (base == "bool" or not isinstance(value, bool))
        if base == "int" and isinstance(value, float) and value.is_integer():
            ok = False  # 2.0 for an integer field: say so rather than truncate silently
        if not ok:
            raise ValueError(f"{owner}.{key} must be {'an integer' if base == 'int' else 'a ' + base}, got {value!r}")
    elif base.startswith("tuple[") and not isinstance(value, (tuple, list)):
        raise ValueError(f"{owner}.{key} must be a list (JSON, e.g. [1, 2]), got {value!r}")


def _set(obj: Any, key: str, value: Any) -> None:
    names = {f.name: f for f in dataclasses.fields(obj)}
    if key not in names:
        raise KeyError(f"{type(obj).__name__} has no field {key!r}; fields: {', '.join(names)}")
    annotation = str(names[key].type).replace(" ", "")
    if isinstance(value, str):  # from the command line: JSON, except for string fields
        if annotation in ("str", "str|None"):
            value = None if value == "null" and annotation == "str|None" else value
        else:
            value = _parse_value(value)
    _check_type(type(obj).__name__, key, annotation, value)
    if isinstance(value, list) and isinstance(getattr(obj, key), tuple):
        value = tuple(value)
    setattr(obj, key, value)


@checked
def make_recipe(name: str | Recipe, **overrides: Any) -> Recipe:
    """The recipe ``name`` (a key of :data:`RECIPES`, or a recipe to copy) with ``overrides`` applied.

    Keys are recipe fields, or ``model.<field>`` (also spelt ``model__<field>`` as a keyword) for the model
    config; ``model=`` replaces the whole model config. String values are parsed as JSON where the field is
    not a string (so the command line's ``--set epochs=3`` gives an ``int``). Unknown keys raise ``KeyError``
    naming the fields."""
    if isinstance(name, Recipe):
        recipe = dataclasses.replace(name)
        recipe.model = dataclasses.replace(name.model)
    else:
        if name not in RECIPES:
            raise KeyError(f"unknown recipe {name!r}; recipes: {', '.join(sorted(RECIPES))}")
        recipe = RECIPES[name]()
    for key, value in overrides.items():
        key = key.replace("__", ".")
        if key.startswith("model."):
            _set(recipe.model, key[len("model.") :], value)
        else:
            _set(recipe, key, value)
    if dataclasses.is_dataclass(getattr(recipe, "model", None)):  # the model config's own checks, on the new values
        recipe.model = dataclasses.replace(recipe.model)
    recipe.validate()
    return recipe


def recipe_config(name: str, config: dict[str, Any]) -> Recipe:
    """Rebuild a recipe from the ``config`` a run's history recorded (the inverse of :meth:`Recipe.config`)."""
    model = config.get("model", {})
    flat = {k: v for k, v in config.items() if k != "model"}
    flat.update({f"model.{k}": v for k, v in model.items()})
    return make_recipe(name, **flat)
