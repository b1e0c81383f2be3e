"""Explorers for trained capsule classifiers (Sabour CapsNet, Efficient-CapsNet), built on
:func:`capsule_lib.viz.widgets.explorer`. Each wires controls to a static twin from
:mod:`capsule_lib.viz.capsules`, which the chapters also draw as ordinary figures for the rendered page.
"""

from __future__ import annotations

from collections.abc import Sequence

import ipywidgets as W
import torch

from ..functional import capsule_lengths
from ..types import RoutingTrace
from .capsules import perturb_poses, plot_perturbation, plot_routing_step
from .widgets import Explorer, explorer

__all__ = ["capsule_routing_explorer", "perturbation_explorer", "lengths_readout"]


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
