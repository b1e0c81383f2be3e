"""Explorers for trained capsule classifiers (CapsNet, Efficient-CapsNet, EM, Heinsen, inverted attention),
built on :func:`capsule_lib.viz.widgets.explorer`. Each wires controls to a static twin from the static modules
of ``capsule_lib.viz``, which the chapters also draw as ordinary figures for the rendered page. An explorer
that recomputes for a slider's value does so through :mod:`capsule_lib.analysis` or the measurements of
:mod:`capsule_lib.critique` (the model it is given is only passed on to such a function, once per setting, cached);
it never runs the model itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import ipywidgets as W
import torch

from .._contracts import checked
from ..analysis import (
    class_attention_maps,
    class_credit_maps,
    class_poses,
    em_class_inputs,
    em_class_trace,
    grid_geometry,
    pose_projection,
)
from ..critique import reroute_image
from ..functional import capsule_lengths
from ..types import RoutingTrace
from .capsules import perturb_poses, plot_perturbation, plot_routing_step
from .critique import plot_rerouted_image
from .em import EM_LAMBDA_SCALES, em_readout, plot_em_state
from .heinsen import credit_readout, plot_class_credits, plot_viewpoint_state
from .inverted import attention_readout, plot_attention_maps
from .widgets import Explorer, explorer

__all__ = [
    "capsule_routing_explorer",
    "perturbation_explorer",
    "lengths_readout",
    "em_routing_explorer",
    "pose_trajectory_explorer",
    "class_credit_explorer",
    "attention_explorer",
    "iteration_explorer",
]


def lengths_readout(lengths: Sequence[float], label: int | None = None, classes: Sequence[str] | None = None) -> str:
    """``"capsule lengths: 0:0.03 1:0.91* ..."`` (``*`` marks the label; ``classes``: names instead of indices)."""
    names = classes if classes is not None else [str(k) for k in range(len(lengths))]
    parts = [f"{names[k]}:{float(v):.2f}{'*' if k == label else ''}" for k, v in enumerate(lengths)]
    return "capsule lengths: " + " ".join(parts)


@checked
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
        return lengths_readout(capsule_lengths(trace.outputs[iteration - 1][image].float()).tolist(), None, classes)

    return explorer(
        controls,
        lambda image, iteration: plot_routing_step(
            images[image], trace, image, iteration - 1, grid=grid, classes=classes
        ),
        readout,
    )


@checked
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
        return lengths_readout(capsule_lengths(p.float()).tolist(), label, classes)

    def reset(ex: Explorer) -> None:
        ex.set_values(**{f"d{k}": 0.0 for k in range(D)})

    return explorer(controls, draw, readout, buttons={"reset": reset})


@checked
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
    (:func:`~capsule_lib.analysis.em_class_inputs`); each setting is routed by
    :func:`~capsule_lib.analysis.em_class_trace`, and the figure and the readout share one routing.

    Static twin: :func:`~capsule_lib.viz.em.plot_em_state` (readout :func:`~capsule_lib.viz.em.em_readout`)."""
    poses, acts = em_class_inputs(model, images)
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
        return em_class_trace(model, poses[image : image + 1], acts[image : image + 1], iterations, scale)

    def draw(image: int, iterations: int, scale: float):
        label = int(labels[image]) if labels is not None else None
        trace = route(image, iterations, scale)
        return plot_em_state(images[image], trace, 0, None, classes, label, title=f"lambda = {scale:g} x {base:g}")

    def readout(image: int, iterations: int, scale: float) -> str:
        return em_readout(route(image, iterations, scale), 0, classes)

    return explorer(controls, draw, readout)


@checked
def pose_trajectory_explorer(
    model: torch.nn.Module,
    sweep: Callable[[int, int], torch.Tensor],
    category: int,
    classes: Sequence[str],
    reference: tuple[int, int] = (4, 0),
    azimuths_deg: Sequence[int] = tuple(range(0, 360, 20)),
) -> Explorer:
    """Move the camera around one object and watch its class capsule's pose: sliders ``"azimuth"`` (index
    0-17), ``"elevation"`` (0-8) and ``"lighting"`` (0-5). ``sweep(elevation, lighting)`` returns the object's
    images at every azimuth (``[18, 2, H, W]``; each sweep is fetched or rendered once and cached). The
    figure shows the view, the class probabilities of a
    :class:`~capsule_lib.models.SmallNORBClassifier` and the pose of class capsule ``category`` along the
    current azimuth sweep in the 2-D PCA of the ``reference`` (elevation, lighting) sweep, drawn in grey
    (:func:`~capsule_lib.analysis.class_poses`, :func:`~capsule_lib.analysis.pose_projection`).

    Static twin: :func:`~capsule_lib.viz.heinsen.plot_viewpoint_state` (the full trajectories:
    :func:`~capsule_lib.viz.heinsen.plot_pose_trajectories`)."""

    @functools.lru_cache(maxsize=16)
    def run(elevation: int, lighting: int):
        images = sweep(elevation, lighting)
        probs, poses = class_poses(model, images)
        return images, probs, poses[:, category]

    proj = pose_projection(run(*reference)[2])
    ref_track = proj.apply(run(*reference)[2])
    controls = {
        "azimuth": W.IntSlider(
            value=0, min=0, max=len(azimuths_deg) - 1, description="azimuth", continuous_update=False
        ),
        "elevation": W.IntSlider(value=reference[0], min=0, max=8, description="elevation", continuous_update=False),
        "lighting": W.IntSlider(value=reference[1], min=0, max=5, description="lighting", continuous_update=False),
    }

    def draw(azimuth: int, elevation: int, lighting: int):
        images, probs, poses = run(elevation, lighting)
        return plot_viewpoint_state(
            images[azimuth],
            probs[azimuth],
            proj.apply(poses),
            azimuth,
            classes,
            category,
            ref_track,
            title=f"azimuth {azimuths_deg[azimuth]} deg, elevation {30 + 5 * elevation} deg, lighting {lighting}",
        )

    def readout(azimuth: int, elevation: int, lighting: int) -> str:
        _, probs, _ = run(elevation, lighting)
        pred = int(probs[azimuth].argmax())
        return (
            f"azimuth {azimuths_deg[azimuth]} deg, elevation {30 + 5 * elevation} deg, lighting {lighting}: "
            f"predicts {classes[pred]} (p={float(probs[azimuth, pred]):.2f})"
        )

    return explorer(controls, draw, readout)


@checked
def class_credit_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    classes: Sequence[str],
) -> Explorer:
    """Which part capsules each class capsule of a :class:`~capsule_lib.models.SmallNORBClassifier` explains:
    sliders ``"image"`` and ``"iteration"`` (of the class routing); each image's maps come from
    :func:`~capsule_lib.analysis.class_credit_maps`. Static twin:
    :func:`~capsule_lib.viz.heinsen.plot_class_credits` (readout :func:`~capsule_lib.viz.heinsen.credit_readout`)."""
    T = model.config.iterations

    @functools.lru_cache(maxsize=8)
    def run(image: int):
        maps, probs = class_credit_maps(model, images[image : image + 1])
        return maps[0], probs[0]  # [T, K, h, w], [K]

    controls = {
        "image": W.IntSlider(value=0, min=0, max=images.shape[0] - 1, description="image", continuous_update=False),
        "iteration": W.IntSlider(value=T, min=1, max=T, description="iteration", continuous_update=False),
    }

    def draw(image: int, iteration: int):
        maps, _ = run(image)
        label = int(labels[image]) if labels is not None else None
        return plot_class_credits(images[image], maps[iteration - 1 : iteration], classes, label, [iteration])

    def readout(image: int, iteration: int) -> str:
        maps, probs = run(image)
        return credit_readout(maps[iteration - 1], probs, classes)

    return explorer(controls, draw, readout)


@checked
def attention_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    classes: Sequence[str],
    max_iterations: int = 4,
) -> Explorer:
    """Where the class capsules of a :class:`~capsule_lib.models.CapsModel` take their votes from: controls
    ``"image"`` (slider), ``"class"`` (dropdown: the class predicted after the shown update, or any class) and
    ``"iteration"`` (which update of the class layer; the model is routed with ``max_iterations`` updates, so
    iterations after the model's own T show what more routing would do; the probabilities are those after the
    shown update; :func:`~capsule_lib.analysis.class_attention_maps`). Static twin:
    :func:`~capsule_lib.viz.inverted.plot_attention_maps` (readout
    :func:`~capsule_lib.viz.inverted.attention_readout`)."""
    geometry = grid_geometry(model)[-1]

    @functools.lru_cache(maxsize=16)
    def run(image: int):
        maps, probs = class_attention_maps(model, images[image : image + 1], iterations=max_iterations)
        return maps[0], probs[0]  # [T, K, h, w], [T, K]

    options = [("predicted", -1)] + [(c, k) for k, c in enumerate(classes)]
    controls = {
        "image": W.IntSlider(value=0, min=0, max=images.shape[0] - 1, description="image", continuous_update=False),
        "class": W.Dropdown(options=options, value=-1, description="class"),
        "iteration": W.IntSlider(
            value=model.config.iterations, min=1, max=max_iterations, description="iteration", continuous_update=False
        ),
    }

    def target(image: int, iteration: int, klass: int) -> int:  # "predicted": after this update
        return int(run(image)[1][iteration - 1].argmax()) if klass < 0 else klass

    def draw(image: int, iteration: int, **kw):
        maps, probs = run(image)
        k = target(image, iteration, kw["class"])
        label = [int(labels[image])] if labels is not None else None
        t = slice(iteration - 1, iteration)
        return plot_attention_maps(
            images[image : image + 1], maps[None, t], classes, geometry, [k], label, probs[None, t], [iteration]
        )

    def readout(image: int, iteration: int, **kw) -> str:
        maps, probs = run(image)
        k = target(image, iteration, kw["class"])
        return f"update {iteration}: " + attention_readout(maps[iteration - 1], probs[iteration - 1], classes, k)

    return explorer(controls, draw, readout)


@checked
def iteration_explorer(
    models: dict[str, torch.nn.Module],
    images: torch.Tensor,
    max_iterations: int = 10,
    grid: tuple[int, int, int] = (16, 6, 6),
    classes: Sequence[str] | None = None,
) -> Explorer:
    """The chapter "Do capsules need routing?"'s explorer: pick a network (``"network"``), an image (``"image"``)
    and the routing iterations used at test time (``"iterations"``, 1 to ``max_iterations``); each network and image
    is routed once for every ``T`` (:func:`~capsule_lib.critique.reroute_image`, cached).

    Static twins: :func:`~capsule_lib.viz.critique.plot_rerouted_image` (one ``T``) and
    :func:`~capsule_lib.viz.critique.plot_image_iterations` (all of them)."""
    its = tuple(range(1, max_iterations + 1))

    @functools.lru_cache(maxsize=64)
    def routed(network: str, image: int):
        return reroute_image(models[network], images[image], its)

    controls = {
        "network": W.Dropdown(options=list(models), description="network"),
        "image": W.IntSlider(value=0, min=0, max=images.shape[0] - 1, description="image", continuous_update=False),
        "iterations": W.IntSlider(
            value=1, min=1, max=max_iterations, description="iterations", continuous_update=False
        ),
    }

    def readout(network: str, image: int, iterations: int) -> str:
        r = routed(network, image)
        changed = sum(p != r.predictions[0] for p in r.predictions)
        said = r.predictions[iterations - 1]
        return (
            f"prediction at T = {iterations}: {classes[said] if classes is not None else said}; it differs from "
            f"T = 1's at "
            f"{changed} of {len(its)} values of T"
        )

    return explorer(
        controls,
        lambda network, image, iterations: plot_rerouted_image(
            images[image], routed(network, image), iterations - 1, grid=grid, classes=classes
        ),
        readout,
    )
