"""Argument contracts read from annotations: :func:`checked` makes a function refuse, in one line naming the argument,
a value of the wrong type before its body runs (a string where a tensor goes, ``1.5`` or ``True`` for a count, a
tensor for a name), and a NaN or an infinity for a number (``float``) argument. :func:`check_fields` does the same
for a dataclass config's fields.

Every function a chapter or the README tells readers to call is checked this way (``tests/test_bad_inputs.py``
builds a wrong value for each of their annotated arguments from these rules and expects exactly this refusal), except
the functions a model's forward pass calls (routing, squash, lengths), which check their tensors themselves
(:func:`~capsule_lib._checks.check_tensor`): a check per call would cost time and break ``torch.compile``'s graphs.

The rules, for an annotation ``A`` and a value ``v`` (``ValueError`` when ``v`` does not match):

* ``Any``, an unannotated argument, ``*args`` / ``**kwargs``: anything;
* ``X | Y``, ``Optional[X]``: either; ``Literal[...]``: one of the literals;
* ``bool``: ``True`` or ``False`` only; ``int``: an integer that is not a bool; ``float``: a real number (an integer
  too), finite unless the function names the argument in ``allow_nonfinite``; ``str``: a string;
* ``Sequence[X]``, ``tuple[X, ...]``, ``list[X]``: a list or tuple (not a string), each item an ``X``; a fixed
  ``tuple[X, Y]``: that many items; ``dict[K, V]`` / ``Mapping``: a mapping; ``Callable``: a callable;
* any class (``torch.Tensor``, ``nn.Module``, a config, ``os.PathLike``, ``torch.device``): an instance of it.
"""

from __future__ import annotations

import builtins
import collections.abc as cabc
import dataclasses
import functools
import inspect
import math
import numbers
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import torch

__all__ = ["checked", "check_fields", "check_value", "resolve_hints", "describe_value", "describe_hint"]

_F = TypeVar("_F", bound=Callable[..., Any])


def checked(fn: _F | None = None, *, allow_nonfinite: tuple[str, ...] = ()) -> Any:
    """Decorator: check every annotated argument of ``fn`` against its annotation (the module docstring's rules)
    before ``fn`` runs; a mismatch is one ``ValueError`` ``"<function>: <argument> must be <what>, got <value>"``.

    ``allow_nonfinite``: ``float`` arguments for which NaN or ``inf`` means something (a missing value shown as
    such, no limit)."""
    if fn is None:
        return functools.partial(checked, allow_nonfinite=allow_nonfinite)
    signature = inspect.signature(fn)
    hints: dict[str, Any] | None = None
    name = fn.__qualname__

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nonlocal hints
        if hints is None:
            hints = resolve_hints(fn)
        bound = signature.bind(*args, **kwargs)  # missing or unknown arguments: Python's own one-line TypeError
        for arg, value in bound.arguments.items():
            kind = signature.parameters[arg].kind
            if kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD) or arg not in hints:
                continue
            check_value(value, hints[arg], f"{name}: {arg}", finite=arg not in allow_nonfinite)
        return fn(*args, **kwargs)

    wrapper.__checked__ = True  # type: ignore[attr-defined]
    wrapper.__allow_nonfinite__ = allow_nonfinite  # type: ignore[attr-defined]
    return wrapper


def check_fields(config: Any, skip: tuple[str, ...] = ()) -> None:
    """Check every field of the dataclass ``config`` against its annotation (the module docstring's rules) and the
    range its name gives (:func:`_config_range`: counts >= 1, ``eps`` > 0...): what a model config's ``__post_init__``
    calls first, so ``CapsNetConfig(iterations="3")`` or ``iterations=0`` is refused in one line. ``skip``: fields the
    config converts first (read back from JSON) and checks afterwards."""
    hints = resolve_hints(type(config))
    owner = type(config).__name__
    for f in dataclasses.fields(config):
        if f.name in hints and f.name not in skip:
            value = getattr(config, f.name)
            check_value(value, hints[f.name], f"{owner}: {f.name}")
            ok, what = _config_range(f.name, value)
            if not ok:
                raise ValueError(f"{owner}: {f.name} must be {what}, got {value!r}")


def _config_range(name: str, value: Any) -> tuple[bool, str]:
    """The range of a model config's number field, from its name: counts and sizes (every ``int``) >= 1, a padding
    >= 0; an ``eps``, a standard deviation > 0; a dropout or a momentum a fraction. ``(ok, the range in words)``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return True, ""
    if isinstance(value, numbers.Integral):
        return (value >= 0, ">= 0") if name.endswith("padding") else (value >= 1, ">= 1")
    if name == "eps" or name.endswith("_eps") or name.endswith("_std"):
        return value > 0, "> 0"
    if name == "dropout":
        return 0 <= value < 1, "in [0, 1)"
    if name.endswith("momentum"):
        return 0 <= value <= 1, "in [0, 1]"
    return True, ""


def check_value(value: Any, hint: Any, name: str, *, finite: bool = True) -> None:
    """One ``ValueError`` (``"<name> must be <what>, got <value>"``) unless ``value`` matches ``hint``."""
    if not _matches(value, hint):
        raise ValueError(f"{name} must be {describe_hint(hint)}, got {describe_value(value)}")
    if finite and _is_float_hint(hint) and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


# ------------------------------------------------------------------------------------------ annotations
class _Unknown:
    """Stands for a name an annotation uses that the module does not define at run time (imported only for type
    checkers): anything matches it."""


class _Namespace(dict):
    def __missing__(self, key: str) -> Any:
        return _Unknown


def resolve_hints(obj: Any) -> dict[str, Any]:
    """``obj``'s annotations (a function, or a class's fields) as objects: the strings of ``from __future__ import
    annotations`` evaluated in the defining module, with names it imports only for type checkers read as "anything"."""
    target = inspect.unwrap(obj)
    module = sys.modules.get(getattr(target, "__module__", ""), None)
    scope = _Namespace({**vars(typing), **vars(builtins)})
    scope.update(vars(module) if module is not None else {})
    raw: dict[str, Any] = {}
    for klass in reversed(target.__mro__) if isinstance(target, type) else [target]:
        raw.update(getattr(klass, "__annotations__", {}) or {})
    hints = {}
    for key, text in raw.items():
        if key == "return":
            continue
        try:
            hints[key] = eval(text, scope) if isinstance(text, str) else text  # noqa: S307 - the library's own source
        except Exception:  # noqa: BLE001 - an annotation this check cannot read checks nothing
            hints[key] = _Unknown
    return hints


# ------------------------------------------------------------------------------------------ matching
def _args(hint: Any) -> tuple:
    return typing.get_args(hint)


def _origin(hint: Any) -> Any:
    return typing.get_origin(hint)


def _is_union(hint: Any) -> bool:
    return _origin(hint) in (typing.Union, types.UnionType)


def _is_float_hint(hint: Any) -> bool:
    if hint is float:
        return True
    return _is_union(hint) and float in _args(hint)


def _matches(value: Any, hint: Any) -> bool:
    if hint in (Any, _Unknown, inspect.Parameter.empty, object) or isinstance(hint, TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    if _is_union(hint):
        return any(_matches(value, h) for h in _args(hint))
    origin = _origin(hint)
    if origin is typing.Literal:
        return any(value is v or (type(value) is type(v) and value == v) for v in _args(hint))
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list, cabc.Sequence, cabc.Iterable, cabc.Collection) or hint in (tuple, list):
        return _matches_sequence(value, hint, origin or hint)
    if origin in (dict, cabc.Mapping) or hint in (dict, cabc.Mapping):
        if not isinstance(value, cabc.Mapping):
            return False
        kv = _args(hint)
        return not kv or all(_matches(k, kv[0]) and _matches(v, kv[1]) for k, v in list(value.items())[:64])
    if origin is cabc.Callable or hint is cabc.Callable:
        return callable(value)
    if origin is type:
        return isinstance(value, type)
    if origin is not None:  # another generic (e.g. a class subscripted): its class
        return isinstance(value, origin) if isinstance(origin, type) else True
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # a form this check does not know: nothing to refuse


def _matches_sequence(value: Any, hint: Any, origin: Any) -> bool:
    if isinstance(value, range):  # range(6) is a sequence of integers wherever one is asked for
        args = _args(hint)
        return not args or _matches(0, args[0]) or args[0] in (Any, _Unknown)
    if _numeric_array(value):  # a tensor or an array of numbers stands for a list of them (one per leading index)
        return value.ndim >= _depth(hint) >= 1
    if isinstance(value, (str, bytes, torch.Tensor)) or not isinstance(value, (list, tuple)):
        if origin in (cabc.Iterable, cabc.Collection) and isinstance(value, (set, frozenset, cabc.Mapping)):
            args = _args(hint)
            return not args or all(_matches(v, args[0]) for v in list(value)[:256])
        return False
    args = _args(hint)
    if not args:
        return True
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
    return all(_matches(v, args[0]) for v in value[:256])


def _numeric_array(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype != torch.bool and not value.dtype.is_complex
    return type(value).__module__ == "numpy" and getattr(value, "dtype", None) is not None and value.dtype.kind in "iuf"


def _depth(hint: Any) -> int:
    """How many sequence levels ``hint`` nests down to numbers (``Sequence[float]`` 1, ``Sequence[Sequence[int]]`` 2;
    0 when its items are not numbers)."""
    args = _args(hint)
    if not args:
        return 1
    item = args[0]
    if item in (int, float) or _is_union(item) and set(_args(item)) <= {int, float}:
        return 1
    origin = _origin(item)
    if origin in (tuple, list, cabc.Sequence, cabc.Iterable, cabc.Collection):
        inner = _depth(item)
        return inner + 1 if inner else 0
    return 0


# ------------------------------------------------------------------------------------------ messages
def describe_hint(hint: Any) -> str:
    """An annotation in words, for a one-line message (``int | None`` -> "an integer or None")."""
    if hint is None or hint is type(None):
        return "None"
    if _is_union(hint):
        return " or ".join(dict.fromkeys(describe_hint(h) for h in _args(hint)))
    origin = _origin(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(v) for v in _args(hint))
    words = {bool: "True or False", int: "an integer", float: "a number", str: "a string", torch.Tensor: "a tensor"}
    if hint in words:
        return words[hint]
    if origin in (tuple, list, cabc.Sequence, cabc.Iterable, cabc.Collection) or hint in (tuple, list):
        args = _args(hint)
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return f"a list of {len(args)} ({', '.join(describe_hint(a) for a in args)})"
        return f"a list (each item {describe_hint(args[0])})" if args else "a list or tuple"
    if origin in (dict, cabc.Mapping) or hint in (dict, cabc.Mapping):
        return "a dict"
    if origin is cabc.Callable or hint is cabc.Callable:
        return "a function"
    name = getattr(hint, "__name__", None) or str(hint)
    return f"a {name}"


def describe_value(value: Any) -> str:
    """A value as a one-line message shows it: its repr when short, else its type (a tensor by its shape)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)} ({value.dtype})"
    text = repr(value)
    return text if len(text) <= 60 and "\n" not in text else f"a {type(value).__name__}"
