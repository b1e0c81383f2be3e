"""Explorers for trained capsule classifiers (Sabour CapsNet, Efficient-CapsNet), built on
:func:`capsule_lib.viz.widgets.explorer`. Each wires controls to a static twin from
:mod:`capsule_lib.viz.capsules`, which the chapters also draw as ordinary figures for the rendered page.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import ipywidgets as W
import torch

from ..functional import capsule_lengths
from ..types import RoutingTrace
from .capsules import perturb_poses, plot_perturbation, plot_routing_step
from .em import EM_LAMBDA_SCALES, em_readout, plot_em_state
from .widgets import Explorer, explorer

__all__ = [
    "capsule_routing_explorer",
    "perturbation_explorer",
    "lengths_readout",
    "em_routing_explorer",
]


def lengths_readout(lengths: Sequence[float], label: int | None = None) -> str:
    """``"capsule lengths: 0:0.03 1:0.91* ..."`` (``*`` marks the label)."""
    parts = [f"{k}:{float(v):.2f}{'*' if k == label else ''}" for k, v in enumerate(lengths)]
    return "capsule lengths: " + " ".join(parts)


def capsule_routing_explorer(
    images: torch.Tensor,
    trace: RoutingTrace,
    grid: tuple[int, int, int] = (32, 6, 6),
    classes: Sequence[str] | None = None,
) -> Explorer:
    """Pick an image (``"image"``) and a routing iteration (``"iteration"``) of a recorded trace.

    Static twin: :func:`~capsule_lib.viz.capsules.plot_routing_step`."""
    n, T = images.shape[0], trace.iterations
    controls = {
        "image": W.IntSlider(value=0, min=0, max=n - 1, description="image", continuous_update=False),
        "iteration": W.IntSlider(value=T, min=1, max=T, description="iteration", continuous_update=False),
    }

    def readout(image: int, iteration: int) -> str:
        return lengths_readout(capsule_lengths(trace.outputs[iteration - 1][image].float()).tolist())

    return explorer(
        controls,
        lambda image, iteration: plot_routing_step(
            images[image], trace, image, iteration - 1, grid=grid, classes=classes
        ),
        readout,
    )


def perturbation_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    poses: torch.Tensor,
    labels: torch.Tensor,
    value_range: float = 0.25,
    step: float = 0.05,
    perturb: str = "all",
    classes: Sequence[str] | None = None,
) -> Explorer:
    """The capsule-dimension perturbation explorer: one slider per pose dimension (``"dim 0"`` ...,
    ``±value_range`` in steps of ``step``), a sample picker (``"sample"``) and a ``"reset"`` button.

    ``poses [N, K, D]`` are the class capsules of ``images [N, C, H, W]`` (computed once by the caller).
    Static twin: :func:`~capsule_lib.viz.capsules.plot_perturbation`."""
    n, _, D = poses.shape
    dims = {
        f"d{k}": W.FloatSlider(
            value=0.0,
            min=-value_range,
            max=value_range,
            step=step,
            description=f"dim {k}",
            readout_format="+.2f",
            continuous_update=False,
        )
        for k in range(D)
    }
    controls = {"sample": W.IntSlider(value=0, min=0, max=n - 1, description="sample", continuous_update=False), **dims}

    def offsets(values: dict) -> list[float]:
        return [float(values[f"d{k}"]) for k in range(D)]

    def draw(sample: int, **values: float):
        return plot_perturbation(
            model, images[sample], poses[sample], int(labels[sample]), offsets(values), perturb, classes
        )

    def readout(sample: int, **values: float) -> str:
        label = int(labels[sample])
        p = perturb_poses(poses[sample], offsets(values), None if perturb == "all" else label)
        return lengths_readout(capsule_lengths(p.float()).tolist(), label)

    def reset(ex: Explorer) -> None:
        ex.set_values(**{f"d{k}": 0.0 for k in range(D)})

    return explorer(controls, draw, readout, buttons={"reset": reset})


def em_routing_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    classes: Sequence[str] | None = None,
    max_iterations: int = 6,
) -> Explorer:
    """EM routing of the class capsules of an :class:`~capsule_lib.models.EMCapsNet`, re-run live: sliders for the
    image (``"image"``), the number of EM ``"iterations"`` (1 ... ``max_iterations``) and the inverse
    temperature (``"lambda x"``, a multiple of the model's ``final_lambda``, from
    :data:`~capsule_lib.viz.em.EM_LAMBDA_SCALES`). Everything below the class layer is computed once
    (:meth:`~capsule_lib.models.EMCapsNet.class_inputs`); the figure and the readout share one routing.

    Static twin: :func:`~capsule_lib.viz.em.plot_em_state` (readout :func:`~capsule_lib.viz.em.em_readout`)."""
    with torch.no_grad():
        poses, acts = model.class_inputs(images)
    base = model.config.final_lambda
    T0 = model.config.iterations
    controls = {
        "image": W.IntSlider(value=0, min=0, max=images.shape[0] - 1, description="image", continuous_update=False),
        "iterations": W.IntSlider(
            value=T0, min=1, max=max_iterations, description="iterations", continuous_update=False
        ),
        "scale": W.SelectionSlider(
            options=[(f"{s:g}", s) for s in EM_LAMBDA_SCALES],
            value=1.0,
            description="lambda x",
            continuous_update=False,
        ),
    }

    @functools.lru_cache(maxsize=4)  # the figure and the readout of one setting share one routing
    def route(image: int, iterations: int, scale: float):
        with torch.no_grad():
            (_, _), trace = model.route_classes(
                poses[image : image + 1], acts[image : image + 1], iterations, base * scale
            )
        return trace.detach()

    def draw(image: int, iterations: int, scale: float):
        label = int(labels[image]) if labels is not None else None
        trace = route(image, iterations, scale)
        return plot_em_state(images[image], trace, 0, None, classes, label, title=f"lambda = {scale:g} x {base:g}")

    def readout(image: int, iterations: int, scale: float) -> str:
        return em_readout(route(image, iterations, scale), 0, classes)

    return explorer(controls, draw, readout)
