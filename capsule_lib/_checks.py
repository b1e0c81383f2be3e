"""Input validation shared by every layer: clear ``ValueError`` messages that name the expected shape."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Collection, Sequence
from typing import Any, TypeVar

import torch

from .types import ImageContract

__all__ = [
    "float_images",
    "check_tensor",
    "check_nonempty",
    "check_module_input",
    "check_image_range",
    "check_model_input",
    "check_images",
    "check_image_values",
    "module_device",
    "device_available",
    "check_device",
    "check_poses",
    "check_activations",
    "check_iterations",
    "check_choice",
    "resolve_config",
]

_Config = TypeVar("_Config")

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(
    x: torch.Tensor,
    name: str,
    spec: str,
    sizes: Sequence[int | None],
    *,
    min_leading: int | None = None,
    floating: bool = True,
) -> None:
    """Check the trailing dimensions of ``x`` against ``sizes`` (``None`` = any size).

    ``spec`` is the human-readable shape, e.g. ``"[B, n_inp, d_inp]"``; it is quoted in the error.
    If ``min_leading`` is ``None`` the tensor must have exactly ``len(sizes)`` dimensions; otherwise it
    may have ``min_leading`` or more extra leading (batch-like) dimensions.
    """
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name}: expected a torch.Tensor of shape {spec}, got {type(x).__name__}")
    if floating and x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name}: expected a floating-point tensor of shape {spec}, got dtype {x.dtype}")
    n = len(sizes)
    if min_leading is None:
        ok_ndim = x.dim() == n
    else:
        ok_ndim = x.dim() >= n + min_leading
    if not ok_ndim:
        raise ValueError(f"{name}: expected shape {spec}, got {tuple(x.shape)} ({x.dim()} dims)")
    tail = x.shape[x.dim() - n :]
    for got, want in zip(tail, sizes):
        if want is not None and got != want:
            raise ValueError(f"{name}: expected shape {spec} with sizes {_fmt(sizes)}, got {tuple(x.shape)}")


def check_nonempty(x: torch.Tensor, name: str, spec: str, leading: int = 1) -> None:
    """One line for an empty batch (a size 0 among the first ``leading`` dimensions, the batch-like ones; default:
    ``x.shape[0] == 0``), which the routings cannot route: every routing function calls it on its input."""
    if 0 in x.shape[:leading]:
        raise ValueError(f"{name}: empty batch {tuple(x.shape)}; pass at least one sample, shape {spec}")


def _fmt(sizes: Sequence[int | None]) -> str:
    return "(" + ", ".join("*" if s is None else str(s) for s in sizes) + ")"


def check_module_input(x: torch.Tensor, module: torch.nn.Module, name: str, *, dtype: bool = True) -> None:
    """One-line errors instead of torch's deep ones when ``x`` and ``module``'s parameters disagree on the
    device, or (``dtype=True``) on the dtype outside autocast (e.g. fp16 images into an fp32 model, fp16 capsules
    into an fp32 routing layer); the Heinsen routing layers pass ``dtype=False`` (they upcast any float input by
    design). No-op for a module without parameters or a non-tensor ``x``."""
    if not isinstance(x, torch.Tensor):
        return
    p = next(module.parameters(), None)
    if p is None:
        return
    if x.device != p.device and not (x.device.type == p.device.type and None in (x.device.index, p.device.index)):
        raise ValueError(
            f"{name}: the input is on {x.device} but the parameters are on {p.device}; move one of "
            f"them (x.to({str(p.device)!r}) or model.to({str(x.device)!r}))"
        )
    if (
        dtype
        and x.is_floating_point()
        and p.is_floating_point()
        and x.dtype != p.dtype
        and not torch.is_autocast_enabled(x.device.type)
    ):
        raise ValueError(
            f"{name}: the input is {x.dtype} but the parameters are {p.dtype}; convert the input "
            f"(x.to({p.dtype})) or the model (model.to({x.dtype})), or run under torch.autocast"
        )


def check_image_range(x: torch.Tensor, low: float | None, high: float | None, name: str, tol: float = 1e-3) -> None:
    """Refuse float images with NaN or infinite values, or outside ``[low, high]`` (a model trained on [0, 1]
    silently misreads 0-255 or mean/std-normalised input); ``low = high = None`` checks finiteness only.
    ``uint8`` images are the caller's to convert."""
    if not (x.is_floating_point() and x.numel()):
        return
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        n = int((~finite).sum())
        raise ValueError(
            f"{name}: {n} of {x.numel()} pixel values are NaN or infinite; a model cannot classify them (check the "
            f"data pipeline, e.g. a division by a zero standard deviation)"
        )
    if low is None or high is None:
        return
    lo, hi = float(x.min()), float(x.max())
    if lo < low - tol or hi > high + tol:
        raise ValueError(
            f"{name}: float images must be in [{low:g}, {high:g}], got values in [{lo:.3g}, {hi:.3g}]"
            f" (pixel values 0-255 or normalised input?); pass uint8 images or scale them to "
            f"[{low:g}, {high:g}]"
        )


def check_images(x: torch.Tensor, contract: ImageContract, name: str = "x", *, floating: bool = True) -> None:
    """The shape part of a model's :class:`~capsule_lib.types.ImageContract`, reading no pixel (every ``forward``
    calls it, through :func:`check_model_input`): ``[B >= 1, channels, size, size]``; ``floating=False`` also takes
    ``uint8`` images (what ``predict`` and the analyses convert to [0, 1] themselves)."""
    check_tensor(x, name, contract.spec, [None, contract.channels, contract.size, contract.size], floating=floating)
    check_nonempty(x, name, contract.spec)


def check_image_values(x: torch.Tensor, contract: ImageContract, name: str = "x") -> None:
    """The value part of a model's :class:`~capsule_lib.types.ImageContract`, reading every pixel (``predict`` calls it
    on each batch, after converting ``uint8`` to [0, 1]): finite, and in ``contract.value_range`` when it has one."""
    low, high = contract.value_range if contract.value_range is not None else (None, None)
    check_image_range(x, low, high, name)


def check_model_input(x: torch.Tensor, model: torch.nn.Module, arg: str = "x") -> None:
    """What every image model's ``forward`` checks first, in one line each: the device and dtype of its input
    ``arg`` against the parameters (:func:`check_module_input`) and its shape against ``model.input_contract``."""
    name = type(model).__name__
    check_module_input(x, model, name)
    check_images(x, model.input_contract, f"{name}: {arg}")


def float_images(images: torch.Tensor) -> torch.Tensor:
    """Images as float32 in [0, 1] (``uint8`` ones divided by 255)."""
    return images.float() / 255 if images.dtype == torch.uint8 else images.float()


def module_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (or buffer); the CPU for a model without either."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def device_available(device: torch.device) -> bool:
    """Whether this machine has ``device``: the CPU always; ``cuda`` / ``cuda:N`` and ``mps`` when torch sees them."""
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    if device.type == "mps":
        return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    return device.type == "cpu"


def check_device(device: str | torch.device, name: str, what: str = "device") -> torch.device:
    """``device`` as a :class:`torch.device` this machine has, else one line (``name: what ...``) naming the problem
    and what to use instead (torch's own errors name neither: ``"gpu"`` gets a list of 20 device types, a missing
    CUDA surfaces later as a deep error or an advice to move the model there)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(
            f"{name}: {what} {device!r} is not a device name; use 'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if not device_available(dev):
        if dev.type == "cuda":
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            why = f"torch sees {n} CUDA device(s)" if n else "torch sees no CUDA GPU"
        else:
            why = f"torch has no {dev.type} backend here"
        raise ValueError(f"{name}: {what} {str(device)!r} is not available on this machine ({why}); use 'cpu'")
    return dev


def check_poses(poses: torch.Tensor, pose_size: int, spec: str, dims: int) -> None:
    """One-line errors for matrix-capsule poses that a layer with ``pose_size x pose_size`` poses cannot take:
    ``poses`` must have ``dims`` dimensions (``spec``, e.g. ``"[B, n_inp, 16]"``) ending in the ``P*P`` entries of
    square, row-major flattened pose matrices, and a non-empty batch."""
    D = pose_size**2
    if not isinstance(poses, torch.Tensor):
        check_tensor(poses, "poses", spec, [None] * dims)  # names the wrong type
    if poses.dim() == dims + 1 and poses.shape[-1] != poses.shape[-2]:
        raise ValueError(
            f"poses: got non-square {poses.shape[-2]}x{poses.shape[-1]} pose matrices {tuple(poses.shape)}; "
            f"this layer takes {pose_size}x{pose_size} poses flattened to {D} entries, shape {spec}"
        )
    if poses.dim() == dims + 1 and poses.shape[-2:] == (pose_size, pose_size):
        raise ValueError(
            f"poses: got {pose_size}x{pose_size} matrices {tuple(poses.shape)}; flatten them to {D} entries "
            f"(poses.flatten(-2)), shape {spec}"
        )
    if poses.dim() == dims and poses.shape[-1] != D:
        n = poses.shape[-1]
        root = math.isqrt(n)
        what = f"{root}x{root} poses" if root * root == n else "not the entries of a square matrix"
        raise ValueError(
            f"poses: last dimension {n} ({what}); this layer has {pose_size}x{pose_size} poses, "
            f"shape {spec} with {D} entries, got {tuple(poses.shape)}"
        )
    check_tensor(poses, "poses", spec, [None] * dims)
    if poses.shape[0] == 0:
        raise ValueError(f"poses: empty batch {tuple(poses.shape)}; EM routing needs at least one sample, shape {spec}")


def check_activations(a: torch.Tensor, name: str = "activations") -> None:
    """Activations weight the children in the M-step and must lie in ``[0, 1]``: one line naming the range found.
    Skipped while ``torch.compile`` traces (a data-dependent check would break the graph)."""
    if torch.compiler.is_compiling() or a.numel() == 0:
        return
    lo, hi = float(a.detach().min()), float(a.detach().max())
    if lo < 0 or hi > 1 or lo != lo or hi != hi:
        raise ValueError(
            f"{name}: capsule activations must be probabilities in [0, 1], got values in [{lo:.3g}, {hi:.3g}] "
            f"(apply a sigmoid, or pass the activations, not logits)"
        )


def check_class_labels(labels: Any, n_classes: int, where: str, n: int | None = None) -> torch.Tensor:
    """One line (``where: labels ...``) unless ``labels`` are class indices: an integer tensor ``[n]`` (any length when
    ``n`` is ``None``) with values in ``0 .. n_classes - 1`` (a float, a number, a wrong length or a label outside the
    classes would count as errors and lower an accuracy silently). Returns ``labels``."""
    want = f"[N={n}]" if n is not None else "[N]"
    if not isinstance(labels, torch.Tensor):
        raise ValueError(f"{where}: labels must be an integer tensor {want} of class indices, got {_describe(labels)}")
    if labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool:
        raise ValueError(f"{where}: labels must be integer class indices {want}, got dtype {labels.dtype} (.long())")
    if labels.dim() != 1 or (n is not None and labels.shape[0] != n):
        raise ValueError(f"{where}: labels must have shape {want} (one per image), got {tuple(labels.shape)}")
    if labels.numel():
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            raise ValueError(
                f"{where}: labels must be class indices 0..{n_classes - 1} for this model, got values in [{lo}, {hi}]"
            )
    return labels


def check_no_nan(x: torch.Tensor, name: str) -> None:
    """One line when ``x`` holds a NaN (a routing would spread it to every output). Skipped while ``torch.compile``
    traces (a data-dependent check would break the graph)."""
    if torch.compiler.is_compiling() or x.numel() == 0:
        return
    if bool(torch.isnan(x.detach()).any()):
        raise ValueError(
            f"{name}: holds NaN ({int(torch.isnan(x.detach()).sum())} of {x.numel()} values); pass finite values"
        )


def check_iterations(iterations: int, name: str = "iterations") -> int:
    """The one check of a number of routing iterations: an integer >= 1 (returned as ``int``), else one line."""
    try:
        if isinstance(iterations, bool):  # True is an int to Python; as a count it is a typo
            raise TypeError
        n = operator.index(iterations)
    except TypeError:
        raise ValueError(f"{name} must be an integer >= 1, got {_describe(iterations)}") from None
    if n < 1:
        raise ValueError(f"{name} must be >= 1, got {iterations}")
    return n


def check_choice(value: Any, options: Collection[Any], name: str) -> Any:
    """The one check of an option chosen by name: ``value`` when it is one of ``options``, else one line naming
    them (``options`` as given, e.g. ``sorted(KINDS)``)."""
    try:
        known = not isinstance(value, torch.Tensor) and value in options
    except TypeError:  # unhashable (a list, a dict) where the options are a set or a dict's keys
        known = False
    if not known:
        raise ValueError(f"{name} must be one of {options}, got {_describe(value)}")
    return value


def _describe(value: Any) -> str:
    """A value as an error message shows it: its repr when short and plain, else its type (a tensor is never printed
    in full: the message stays one line)."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 80 and "\n" not in text else f"a {type(value).__name__}"


def resolve_config(config: _Config | None, default: type[_Config], overrides: dict[str, Any]) -> _Config:
    """A model's config: ``config`` (``default()`` when ``None``) with the keyword ``overrides`` applied through
    ``dataclasses.replace``, so the config's own checks (``__post_init__``) run on the result."""
    cfg = config if config is not None else default()
    return dataclasses.replace(cfg, **overrides) if overrides else cfg
