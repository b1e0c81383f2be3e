"""Explorers that work on the rendered page, without a kernel ("page mode").

A slider explorer needs a Python kernel to redraw its figure, so on the static book page it would show
nothing. A page-mode explorer computes its frames for a small grid of slider values when the page is built,
embeds them as PNG images in the page's widget state, and links the sliders to which frame is shown with
``jslink`` (slider ``index`` -> ``Stack.selected_index``): the ipywidgets HTML manager served with the book
does the switching in the browser. In a live kernel the same widgets work too (the full explorers of
:mod:`capsule_lib.viz.explorers` are the interactive version). The explorers that take a model compute their
frames' numbers through :mod:`capsule_lib.analysis` when the page is built and only draw them here.

:func:`page_explorer` builds one from any grid of frames; :func:`perturbation_page_explorer` is the
capsule-dimension perturbation explorer of the CapsNet and Efficient-CapsNet chapters (one dimension at a time,
at 11 offsets).
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import ipywidgets as W
import numpy as np
import torch

from .._contracts import checked
from ..analysis import (
    ToyVotes,
    class_attention_maps,
    class_poses,
    decode_poses,
    em_class_inputs,
    em_class_trace,
    grid_geometry,
    pose_projection,
)
from ..critique import ImageRouting
from ..types import RoutingTrace
from .capsules import perturb_poses, plot_routing_step
from .critique import plot_rerouted_image
from .data import to_display
from .em import EM_LAMBDA_SCALES, plot_em_state
from .heinsen import plot_viewpoint_state
from .inverted import plot_attention_maps
from .toy import plot_routing_state

__all__ = [
    "png_bytes",
    "figure_png",
    "page_explorer",
    "perturbation_page_explorer",
    "routing_page_explorer",
    "toy_routing_page_explorer",
    "em_routing_page_explorer",
    "PAGE_EXPLORER_CLASS",
    "pose_page_explorer",
    "attention_page_explorer",
    "adversarial_page_explorer",
    "iteration_page_explorer",
]

#: the CSS class of every page-mode explorer (the page checks of the book build look for it)
PAGE_EXPLORER_CLASS = "capsule-page-explorer"


def png_bytes(image: torch.Tensor, scale: int = 4) -> bytes:
    """A small PNG of one image ``[C, H, W]`` or ``[H, W]`` (uint8 or float in [0, 1]), enlarged ``scale``
    times with nearest-neighbour pixels (a 28x28 digit is about 1 KB)."""
    from PIL import Image

    arr = np.asarray(to_display(image) * 255.0 + 0.5, dtype=np.uint8)
    img = Image.fromarray(arr)
    img = img.resize((img.width * scale, img.height * scale), Image.NEAREST)
    buf = io.BytesIO()
    img.save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def figure_png(fig, dpi: int = 60) -> bytes:
    """A matplotlib figure as a small PNG (closed afterwards, so it is not also shown as an output)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _control(name: str, labels: Sequence[str], index: int) -> tuple[W.HBox, W.IntSlider, W.Widget]:
    """A slider over ``labels`` whose readout is a ``Stack`` of the labels linked to it. (Widget descriptions,
    ``Label`` and the selection sliders' readouts ask for MathJax 2's ``MathJax.Hub``; the book serves MathJax
    3, so the controls use plain HTML text instead.)"""
    slider = W.IntSlider(
        value=index, min=0, max=len(labels) - 1, readout=False, continuous_update=True, layout=W.Layout(width="260px")
    )
    readout = W.Stack([W.HTML(f"<code>{label}</code>") for label in labels], selected_index=index)
    link = W.jslink((slider, "value"), (readout, "selected_index"))
    return W.HBox([W.HTML(f"<b>{name}</b>", layout=W.Layout(width="90px")), slider, readout]), slider, link


def page_explorer(
    frames: Sequence[Sequence[bytes]],
    rows: tuple[str, Sequence[str]] | None,
    cols: tuple[str, Sequence[str]],
    initial: tuple[int, int] = (0, 0),
    fixed: Sequence[tuple[str, bytes]] = (),
    caption: str = "",
    frame_title: str = "shown",
) -> W.VBox:
    """A two-slider explorer over precomputed PNG ``frames[row][col]`` that needs no kernel.

    ``rows`` / ``cols``: ``(description, labels)`` of the two sliders; ``initial``: the frame shown first;
    ``fixed``: ``(title, png)`` images shown beside the frames (e.g. the input), ``frame_title`` above the
    frames. The row slider picks one of ``len(rows[1])`` stacks, the column slider the frame inside every
    stack, both through ``jslink`` on the slider's ``value``. ``rows=None``: one row of frames, one slider."""
    (row_name, row_labels), (col_name, col_labels) = rows if rows is not None else ("", [""]), cols
    if len(frames) != len(row_labels) or any(len(r) != len(col_labels) for r in frames):
        raise ValueError(
            f"frames must be [{len(row_labels)} rows][{len(col_labels)} columns], got "
            f"[{len(frames)}][{', '.join(str(len(r)) for r in frames)}]"
        )
    row_box, row_slider, row_link = _control(row_name, row_labels, initial[0])
    col_box, col_slider, col_link = _control(col_name, col_labels, initial[1])
    inner = [W.Stack([W.Image(value=png, format="png") for png in row], selected_index=initial[1]) for row in frames]
    outer = W.Stack(inner, selected_index=initial[0])
    links = [col_link]
    if rows is not None:
        links += [row_link, W.jslink((row_slider, "value"), (outer, "selected_index"))]
    links += [W.jslink((col_slider, "value"), (stack, "selected_index")) for stack in inner]

    def titled(title: str, widget: W.Widget) -> W.VBox:
        return W.VBox([W.HTML(f"<b>{title}</b>"), widget])

    images = [titled(t, W.Image(value=png, format="png")) for t, png in fixed] + [titled(frame_title, outer)]
    parts = [row_box, col_box, W.HBox(images)] if rows is not None else [col_box, W.HBox(images)]
    if caption:
        parts.append(W.HTML(f"<small>{caption}</small>"))
    box = W.VBox(parts)
    box.add_class(PAGE_EXPLORER_CLASS)
    box._links = links  # the links are widgets of their own; keep them alive with the explorer
    return box


@checked
def perturbation_page_explorer(
    model: torch.nn.Module,
    image: torch.Tensor,
    poses: torch.Tensor,
    label: int,
    value_range: float = 0.25,
    steps: int = 11,
    perturb: str = "all",
    scale: int = 4,
) -> W.VBox:
    """The perturbation explorer in page mode: pick a pose dimension of the class capsules ``poses [K, D]``
    of ``image`` and an offset in ``[-value_range, +value_range]`` (``steps`` values); the reconstruction from
    the ``label`` capsule is shown. ``D * steps`` reconstructions are decoded in one batch when called
    (:func:`~capsule_lib.analysis.decode_poses`)."""
    K, D = poses.shape
    offsets = torch.linspace(-value_range, value_range, steps)  # [S]
    bumps = torch.zeros(D, steps, D)
    bumps[torch.arange(D), :, torch.arange(D)] = offsets  # [D, S, D]: dimension d moved by each offset
    label_only = None if perturb == "all" else label
    batch = torch.stack([perturb_poses(poses, bumps[d, s], label_only) for d in range(D) for s in range(steps)])
    recons = decode_poses(model, batch, label)  # [D*S, C, H, W]
    frames = [[png_bytes(recons[d * steps + s], scale) for s in range(steps)] for d in range(D)]
    return page_explorer(
        frames,
        rows=("dimension", [str(d) for d in range(D)]),
        cols=("offset", [f"{round(float(v), 4) + 0.0:+.2f}" for v in offsets]),  # no "-0.00"
        initial=(0, steps // 2),
        fixed=[("input", png_bytes(image, scale))],
        frame_title="reconstruction",
        caption=f"{D} x {steps} reconstructions computed when this page was built; the sliders choose one in "
        "your browser (no kernel needed).",
    )


@checked
def routing_page_explorer(
    images: torch.Tensor,
    trace: RoutingTrace,
    n_images: int = 5,
    grid: tuple[int, int, int] = (32, 6, 6),
    classes: Sequence[str] | None = None,
    dpi: int = 60,
) -> W.VBox:
    """The image / routing-iteration picker of the dynamic-routing chapter in page mode: the figure of
    :func:`~capsule_lib.viz.capsules.plot_routing_step` for the first ``n_images`` of ``images`` at every
    iteration of ``trace``, chosen by two sliders in the browser."""
    n, T = min(n_images, images.shape[0]), trace.iterations
    frames = [
        [figure_png(plot_routing_step(images[i], trace, i, t, grid=grid, classes=classes), dpi) for t in range(T)]
        for i in range(n)
    ]
    return page_explorer(
        frames,
        rows=("image", [str(i) for i in range(n)]),
        cols=("iteration", [str(t + 1) for t in range(T)]),
        initial=(0, 0),
        caption=f"{n} x {T} figures computed when this page was built; the sliders choose one in your browser.",
        frame_title="routing",
    )


@checked
def toy_routing_page_explorer(toy: ToyVotes, trace: RoutingTrace, sample: int = 0, dpi: int = 60) -> W.VBox:
    """The primer's routing-iteration explorer in page mode: :func:`~capsule_lib.viz.toy.plot_routing_state`
    at every iteration of ``trace``, chosen by one slider in the browser."""
    T = trace.iterations
    frames = [[figure_png(plot_routing_state(toy, trace, t, sample), dpi) for t in range(1, T + 1)]]
    return page_explorer(
        frames,
        rows=None,
        cols=("iteration", [str(t) for t in range(1, T + 1)]),
        initial=(0, 0),
        caption=f"{T} figures computed when this page was built; the slider chooses one in your browser.",
        frame_title="routing",
    )


@checked
def em_routing_page_explorer(
    model: torch.nn.Module,
    image: torch.Tensor,
    label: int | None = None,
    classes: Sequence[str] | None = None,
    iterations: Sequence[int] = (1, 2, 3, 4, 5),
    scales: Sequence[float] = EM_LAMBDA_SCALES,
    dpi: int = 60,
) -> W.VBox:
    """The EM chapter's iterations x inverse-temperature explorer in page mode, for one image: the class
    capsules of an :class:`~capsule_lib.models.EMCapsNet` re-routed with every number of ``iterations`` and
    every multiple ``scales`` of the model's ``final_lambda`` when the page is built
    (:func:`~capsule_lib.analysis.em_class_inputs` once, :func:`~capsule_lib.analysis.em_class_trace` and
    :func:`~capsule_lib.viz.em.plot_em_state` for each), chosen by two sliders in the browser."""
    base, T0 = model.config.final_lambda, model.config.iterations
    poses, acts = em_class_inputs(model, image.unsqueeze(0))
    frames = []
    for T in iterations:
        row = []
        for s in scales:
            trace = em_class_trace(model, poses, acts, T, s)
            fig = plot_em_state(image, trace, 0, None, classes, label, title=f"lambda = {s:g} x {base:g}")
            row.append(figure_png(fig, dpi))
        frames.append(row)
    return page_explorer(
        frames,
        rows=("iterations", [str(T) for T in iterations]),
        cols=("lambda x", [f"{s:g}" for s in scales]),
        initial=(  # the model's own setting when the grid has it
            list(iterations).index(T0) if T0 in iterations else 0,
            list(scales).index(1.0) if 1.0 in scales else 0,
        ),
        caption=f"{len(iterations)} x {len(scales)} routings computed when this page was built; the sliders choose "
        "one in your browser (no kernel needed).",
        frame_title="EM routing of the class capsules",
    )


@checked
def pose_page_explorer(
    model: torch.nn.Module,
    sweep,
    category: int,
    classes: Sequence[str],
    elevations: Sequence[int] = (0, 4, 8),
    azimuth_step: int = 2,
    reference: tuple[int, int] = (4, 0),
    dpi: int = 60,
) -> W.VBox:
    """The Heinsen chapter's camera explorer in page mode: ``sweep(elevation, lighting)`` gives one object's
    images at the 18 azimuths; for every listed elevation (lighting 0) and every ``azimuth_step``-th azimuth,
    :func:`~capsule_lib.viz.heinsen.plot_viewpoint_state` (view, class probabilities, the pose of class capsule
    ``category`` on its azimuth path in the PCA of the ``reference`` sweep, from
    :func:`~capsule_lib.analysis.class_poses`) is drawn when the page is built; two sliders choose one in the
    browser."""
    _, ref_poses = class_poses(model, sweep(*reference))
    proj = pose_projection(ref_poses[:, category])
    ref_track = proj.apply(ref_poses[:, category])
    cols = list(range(0, 18, azimuth_step))
    frames = []
    for e in elevations:
        images = sweep(e, 0)
        probs, poses = class_poses(model, images)
        track = proj.apply(poses[:, category])
        row = []
        for a in cols:
            fig = plot_viewpoint_state(
                images[a],
                probs[a],
                track,
                a,
                classes,
                category,
                ref_track,
                title=f"azimuth {20 * a} deg, elevation {30 + 5 * e} deg",
            )
            row.append(figure_png(fig, dpi))
        frames.append(row)
    return page_explorer(
        frames,
        rows=("elevation", [f"{30 + 5 * e}°" for e in elevations]),
        cols=("azimuth", [f"{20 * a}°" for a in cols]),
        initial=(list(elevations).index(reference[0]) if reference[0] in elevations else 0, 0),
        caption=f"{len(elevations)} x {len(cols)} views rendered and classified when this page was built; the "
        "sliders choose one in your browser (no kernel needed).",
        frame_title="the view, the class probabilities and the pose on its path",
    )


@checked
def attention_page_explorer(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None,
    classes: Sequence[str],
    iterations: Sequence[int] = (1, 2, 3, 4),
    dpi: int = 100,
) -> W.VBox:
    """The Tsai chapter's attention explorer in page mode: for every image and every number of routing
    ``iterations`` T, the model is routed with T updates (:func:`~capsule_lib.analysis.class_attention_maps`)
    and the map of the class layer's last update into the predicted class is drawn
    (:func:`~capsule_lib.viz.inverted.plot_attention_maps`) when the page is built; sliders ``"image"`` and
    ``"iterations"`` choose one in the browser. The frames are small figures
    (4.4 in wide), saved at 100 dpi so that their 7 pt titles are 9.7 px high (at 60 dpi: 5.8 px)."""
    geometry = grid_geometry(model)[-1]
    frames = []
    for n in range(images.shape[0]):
        row = []
        for T in iterations:
            maps, probs = class_attention_maps(model, images[n : n + 1], iterations=T)
            k = int(probs[0, -1].argmax())
            fig = plot_attention_maps(
                images[n : n + 1],
                maps[:, -1:],
                classes,
                geometry,
                [k],
                [int(labels[n])] if labels is not None else None,
                probs[:, -1:],
                [T],
                title=f"T = {T}: predicted {classes[k]}",
            )
            row.append(figure_png(fig, dpi))
        frames.append(row)
    T0 = model.config.iterations
    return page_explorer(
        frames,
        rows=("image", [str(n) for n in range(images.shape[0])]),
        cols=("iterations", [str(T) for T in iterations]),
        initial=(0, list(iterations).index(T0) if T0 in iterations else 0),
        caption=f"{images.shape[0]} images x {len(iterations)} routings computed when this page was built; the "
        "sliders choose one in your browser (no kernel needed).",
        frame_title="routing into the predicted class (last update)",
    )


@checked
def adversarial_page_explorer(
    frames: dict[str, Sequence[dict]],
    eps: Sequence[float],
    image: torch.Tensor,
    label: int,
    names: dict[str, str] | None = None,
    dpi: int = 80,
) -> W.VBox:
    """The robustness chapter's epsilon explorer in page mode: for each attack of ``frames`` (attack name -> one
    dict of :class:`~capsule_lib.robustness.AdversarialExample` per budget of ``eps``, from
    :func:`~capsule_lib.robustness.adversarial_examples`), the figure of
    :func:`~capsule_lib.viz.robustness.plot_adversarial_frame` at every budget, chosen by two sliders."""
    from .robustness import plot_adversarial_frame

    attacks = list(frames)
    pngs = [[figure_png(plot_adversarial_frame(f, label, names), dpi) for f in frames[a]] for a in attacks]
    return page_explorer(
        pngs,
        rows=("attack", attacks),
        cols=("epsilon", [f"{e:g}" for e in eps]),
        initial=(0, min(2, len(eps) - 1)),
        fixed=[(f"clean ({label})", png_bytes(image, 3))],
        frame_title="each model's adversarial copy and its prediction (red: wrong)",
        caption=f"{len(attacks)} x {len(eps)} figures computed when this page was built; the sliders choose one in "
        "your browser (no kernel needed).",
    )


@checked
def iteration_page_explorer(
    image: torch.Tensor,
    routings: dict[str, ImageRouting],
    grid: tuple[int, int, int] = (16, 6, 6),
    classes: Sequence[str] | None = None,
    dpi: int = 80,
) -> W.VBox:
    """The test-time iteration explorer of the chapter "Do capsules need routing?" in page mode: for one ``image``,
    each network of ``routings`` (label -> :func:`~capsule_lib.critique.reroute_image` of the image) at each of its
    iterations, drawn by :func:`~capsule_lib.viz.critique.plot_rerouted_image` and chosen by two sliders in the
    browser (every network must have been routed with the same iterations)."""
    its = {r.iterations for r in routings.values()}
    if len(its) != 1:
        raise ValueError(f"every network must be routed with the same iterations, got {sorted(its)}")
    (T,) = its
    labels = list(routings)
    frames = [
        [
            figure_png(plot_rerouted_image(image, routings[name], k, grid=grid, classes=classes), dpi)
            for k in range(len(T))
        ]
        for name in labels
    ]
    return page_explorer(
        frames,
        rows=("network", labels),
        cols=("iterations", [str(t) for t in T]),
        initial=(0, 0),
        caption=f"{len(labels)} x {len(T)} figures computed when this page was built; the sliders choose one in your "
        "browser (no kernel needed).",
        frame_title="routing at test time",
    )
