"""What routing does to a trained network, measured: the critics' questions (the chapter "Do capsules need
routing?").

Paik, Kwak & Kim (2019) report that routing mostly polarises the couplings without changing the prediction;
Mitterreiter, Koch, Giesen & Laue (2023) that the couplings stay close to uniform and barely depend on the image (no
dynamic parse tree) and that few parent capsules are used. Two measurements, on any classifier whose ``forward``
takes ``iterations=`` and ``return_routing=`` (:class:`~capsule_lib.models.routing_classifier.RoutingClassifier`):

* :func:`coupling_stats`: how concentrated each child's couplings are (normalised entropy, largest share), how much
  they vary from image to image (coefficient of variation over the images), and how many parents are alive;
* :func:`routing_changes`: the same network routed for ``T = 1, 2, ...`` iterations at test time: how often the
  prediction changes with ``T``, and the couplings' statistics per ``T`` (polarisation).

Both read the couplings ``[N, n_inp, n_out]`` of the last routing iteration from the trace
(:attr:`~capsule_lib.types.RoutingTrace.coefficients`, summing to 1 over the parents). The chapter's tables of
them: :func:`first_pass_rows` (uniform couplings against every routing's first pass) and :func:`change_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ._checks import check_class_labels, check_images, check_iterations, check_tensor, float_images, module_device
from ._contracts import checked
from .comparison import SHORT_LABELS
from .routing.kinds import DEFAULT_ITERATIONS, ROUTING_KINDS

__all__ = [
    "first_pass_rows",
    "change_headers",
    "change_rows",
    "CouplingStats",
    "coupling_stats",
    "alive_share",
    "RoutingChanges",
    "routing_changes",
    "ImageRouting",
    "reroute_image",
    "gradient_by_layer",
    "LayerRouting",
    "routing_by_layer",
]


@dataclass(frozen=True)
class CouplingStats:
    """What a set of couplings says about the parse tree (see :func:`coupling_stats`).

    Attributes
    ----------
    entropy : float
        Mean over images and children of the entropy of a child's couplings over the parents, divided by
        ``log(n_out)``: 1 = uniform (the child commits to no parent), 0 = all to one parent.
    max_share : float
        Mean over images and children of a child's largest coupling, in ``[1 / n_out, 1]``.
    variation : float
        How much the couplings depend on the image: the standard deviation over the images of each ``c_ij``,
        averaged over the pairs and divided by the mean coupling ``1 / n_out`` (0: the same couplings for every
        image, a static routing).
    alive : float or None
        The fraction of parents whose activity exceeds ``threshold`` in at least ``min_share`` of the images;
        ``None`` when no activities were given.
    """

    entropy: float
    max_share: float
    variation: float
    alive: float | None = None


def coupling_stats(
    couplings: torch.Tensor,
    activity: torch.Tensor | None = None,
    threshold: float = 0.5,
    min_share: float = 0.01,
) -> CouplingStats:
    """Statistics of couplings ``[N, n_inp, n_out]`` (summing to 1 over the parents) and, optionally, parent
    activities ``[N, n_out]``.

    Parameters
    ----------
    couplings : torch.Tensor
        ``[N, n_inp, n_out]``, one routing's couplings per image (``N >= 2`` for ``variation``).
    activity : torch.Tensor or None, optional
        ``[N, n_out]``, each parent's activity on the scale ``threshold`` is given in (capsule lengths,
        probabilities); ``None`` (default): ``alive`` is ``None``.
    threshold : float, optional
        The activity above which a parent counts as active on an image (default 0.5).
    min_share : float, optional
        The share of images on which a parent must be active to count as alive (default 0.01).

    Returns
    -------
    CouplingStats
        ``entropy``, ``max_share``, ``variation`` and ``alive``.
    """
    if not isinstance(couplings, torch.Tensor) or couplings.dim() != 3:
        got = tuple(couplings.shape) if isinstance(couplings, torch.Tensor) else type(couplings).__name__
        raise ValueError(f"couplings must be [N >= 2, n_inp, n_out >= 2], got {got}")
    check_tensor(couplings, "couplings", "[N >= 2, n_inp, n_out >= 2]", [None, None, None])
    if couplings.shape[0] < 2 or couplings.shape[2] < 2:
        raise ValueError(f"couplings must be [N >= 2, n_inp, n_out >= 2], got {tuple(couplings.shape)}")
    c = couplings.detach().double()  # [N, i, j]
    J = c.shape[2]
    if not bool(torch.isfinite(c).all()) or float(c.min()) < -1e-6 or float(c.max()) > 1 + 1e-6:
        raise ValueError(
            f"couplings must be shares in [0, 1] (no NaN or inf), got values in [{float(c.min()):.3g}, "
            f"{float(c.max()):.3g}]"
        )
    if not torch.allclose(c.sum(-1), torch.ones_like(c[..., 0]), atol=1e-4):
        raise ValueError("couplings must sum to 1 over the parents (the last axis)")
    c = c.clamp(0, 1)
    _check_share(threshold, "threshold", low=None)
    _check_share(min_share, "min_share")
    ent = -(c * c.clamp_min(1e-30).log()).sum(-1) / math.log(J)  # [N, i] normalised entropy
    ent = ent.clamp(0, 1)  # (float32 shares may sum to 1 + 1e-7: an entropy a hair above 1)
    alive = None
    if activity is not None:
        if activity.shape != (c.shape[0], J):
            raise ValueError(f"activity must be [N={c.shape[0]}, n_out={J}], got {tuple(activity.shape)}")
        alive = alive_share(activity, threshold, min_share)
    return CouplingStats(
        entropy=ent.mean().item(),
        max_share=c.amax(-1).mean().item(),
        variation=(c.std(0).mean() * J).item(),
        alive=alive,
    )


@dataclass(frozen=True)
class RoutingChanges:
    """A trained network routed for each of ``iterations`` at test time (see :func:`routing_changes`).

    Attributes
    ----------
    iterations : tuple of int
        The numbers of routing iterations ``T`` tried.
    default : int
        The network's own ``T`` (what it was trained with).
    predictions : torch.Tensor
        ``[len(iterations), N]``, the predicted class for each ``T``.
    changed_from_first : tuple of float
        Per ``T``: the fraction of images whose prediction differs from ``T = 1``'s (the uniform couplings' pass).
    changed_from_default : tuple of float
        Per ``T``: the fraction whose prediction differs from the network's own ``T``'s.
    accuracy : tuple of float or None
        Per ``T``: the accuracy, when labels were given.
    stats : tuple of CouplingStats
        Per ``T``: :func:`coupling_stats` of the last iteration's couplings (with the class scores as activity when
        they are lengths or probabilities).
    """

    iterations: tuple[int, ...]
    default: int
    predictions: torch.Tensor
    changed_from_first: tuple[float, ...]
    changed_from_default: tuple[float, ...]
    accuracy: tuple[float, ...] | None
    stats: tuple[CouplingStats, ...]


@torch.no_grad()
@checked
def routing_changes(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor | None = None,
    iterations: Sequence[int] = tuple(range(1, 11)),
    batch_size: int = 250,
) -> RoutingChanges:
    """Route ``images`` through ``model`` with each number of iterations in ``iterations`` (eval mode; the model is
    given back in its mode).

    Parameters
    ----------
    model : torch.nn.Module
        A classifier whose ``forward(x, return_routing=True, iterations=T)`` returns a
        :class:`~capsule_lib.types.CapsuleOutput` with a trace, and whose ``routing_iterations`` (the config's) is
        its own ``T`` (:class:`~capsule_lib.models.routing_classifier.RoutingClassifier` with an iterative routing).
    images : torch.Tensor
        ``[N, C, H, W]``, ``uint8`` or floats in [0, 1], ``N >= 2``.
    labels : torch.Tensor or None, optional
        ``[N]`` class indices, for the accuracy per ``T`` (default ``None``).
    iterations : Sequence[int], optional
        The ``T`` to try, each >= 1 and including 1 (default 1..10).
    batch_size : int, optional
        Images per forward pass (default 250).

    Returns
    -------
    RoutingChanges
    """
    config = getattr(model, "config", None)
    default = getattr(config, "routing_iterations", None)
    if default is None:
        raise ValueError(f"{type(model).__name__} has no routing iterations to sweep (an iterative routing's model)")
    if getattr(config, "couplings", "routed") != "routed":
        raise ValueError(f"{type(model).__name__} routes with fixed couplings ({config.couplings}): nothing to sweep")
    its = tuple(check_iterations(t) for t in iterations)
    if 1 not in its:
        raise ValueError(f"iterations must include 1 (the uniform pass), got {its}")
    check_tensor(images, "images", "[N >= 2, C, H, W]", [None, None, None, None], floating=False)
    if images.shape[0] < 2:
        raise ValueError(f"need at least 2 images, got {images.shape[0]}")
    if labels is not None:
        check_class_labels(labels, getattr(config, "n_classes", 1 << 30), "routing_changes", n=images.shape[0])
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    was_training, device = model.training, module_device(model)
    model.eval()
    try:
        preds, stats = [], []
        for T in sorted(set(its) | {default}):
            p, c, act = [], [], []
            for k in range(0, images.shape[0], batch_size):
                x = float_images(images[k : k + batch_size]).to(device)
                out = model(x, return_routing=True, iterations=T)
                p.append(out.scores.argmax(-1).cpu())
                c.append(out.trace.coefficients[-1].reshape(x.shape[0], -1, out.scores.shape[-1]).cpu())
                act.append(out.scores.cpu())
            scores = torch.cat(act)
            active = scores if out.kind in ("lengths", "activations") else None
            preds.append((T, torch.cat(p)))
            stats.append((T, coupling_stats(torch.cat(c), active)))
    finally:
        model.train(was_training)
    by_t, st = dict(preds), dict(stats)
    first, own = by_t[1], by_t[default]
    P = torch.stack([by_t[T] for T in its])  # [len(its), N]
    return RoutingChanges(
        iterations=its,
        default=default,
        predictions=P,
        changed_from_first=tuple((P[k] != first).double().mean().item() for k in range(len(its))),
        changed_from_default=tuple((P[k] != own).double().mean().item() for k in range(len(its))),
        accuracy=None if labels is None else tuple((P[k] == labels).double().mean().item() for k in range(len(its))),
        stats=tuple(st[T] for T in its),
    )


def alive_share(activity: torch.Tensor, threshold: float = 0.5, min_share: float = 0.01) -> float:
    """The fraction of parents ``activity [N, P]`` (on a [0, 1] scale) calls alive: active (``> threshold``) on at
    least ``min_share`` of the ``N`` images. A parent never active is a starved ("dead") capsule."""
    if not isinstance(activity, torch.Tensor) or activity.dim() != 2 or activity.shape[0] < 1:
        got = tuple(activity.shape) if isinstance(activity, torch.Tensor) else type(activity).__name__
        raise ValueError(f"activity must be [N >= 1, n_parents], got {got}")
    check_tensor(activity, "activity", "[N >= 1, n_parents]", [None, None])
    if activity.shape[0] < 1:
        raise ValueError(f"activity must be [N >= 1, n_parents], got {tuple(activity.shape)}")
    if not bool(torch.isfinite(activity).all()):  # a NaN is neither active nor inactive: refuse it
        raise ValueError("activity: holds NaN or inf; pass each parent's finite activity")
    _check_share(threshold, "threshold", low=None)
    _check_share(min_share, "min_share")
    return ((activity.detach() > threshold).double().mean(0) >= min_share).double().mean().item()


def _check_share(value: Any, name: str, low: float | None = 0.0) -> None:
    """One line unless ``value`` is a finite number (in ``[0, 1]`` unless ``low`` is ``None``)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (low is not None and not 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must be a {'number' if low is None else 'share in [0, 1]'}, got {value!r}")


@dataclass(frozen=True)
class LayerRouting:
    """One routing layer of a network at one number of iterations (see :func:`routing_by_layer`).

    Attributes
    ----------
    layer : str
        The layer's name in the network's traces (e.g. ``"conv_caps1"``, or its index).
    depth : int
        Its position among the network's routing layers, 1 = nearest the image.
    iterations : int
        The routing iterations it ran for.
    n_out : int
        The parents each child chooses among (per position for convolutional capsules).
    stats : CouplingStats
        :func:`coupling_stats` of the last iteration's couplings, ``alive`` over every parent (types x positions).
    """

    layer: str
    depth: int
    iterations: int
    n_out: int
    stats: CouplingStats


@torch.no_grad()
@checked
def routing_by_layer(
    model: nn.Module,
    images: torch.Tensor,
    iterations: Sequence[int] = (1, 2, 3),
    threshold: float = 0.5,
    batch_size: int = 100,
) -> list[LayerRouting]:
    """Every routing layer of a multi-layer capsule network, routed for each of ``iterations``: how concentrated and
    how image-dependent its couplings are and how many of its parents are ever active (Mitterreiter et al. 2023's
    questions: is there a parse tree, and do capsules starve as the network gets deeper?).

    Parameters
    ----------
    model : torch.nn.Module
        A network whose ``forward(x, return_routing=True, iterations=T)`` puts one
        :class:`~capsule_lib.types.RoutingTrace` per routing layer in ``extra["traces"]`` (a dict by layer name or a
        list, image side first), each with couplings ``[B, ..., n_inp, n_out]`` and output activations, or output
        capsules whose lengths are the scores (:class:`~capsule_lib.models.EMCapsNet`,
        :class:`~capsule_lib.models.SmallNORBClassifier`, :class:`~capsule_lib.models.RoutingClassifier`); a layer
        with neither has ``alive`` ``None``.
    images : torch.Tensor
        ``[N, C, H, W]``, ``uint8`` or floats in [0, 1], ``N >= 2``.
    iterations : Sequence[int], optional
        The ``T`` to route with (default 1, 2, 3).
    threshold : float, optional
        Activity (probability scale) above which a parent counts as active on an image (default 0.5).
    batch_size : int, optional
        Images per forward pass (default 100).

    Returns
    -------
    list of LayerRouting
        One per layer and ``T``, by ``T`` then depth.
    """
    its = tuple(check_iterations(t) for t in iterations)
    if images.shape[0] < 2:
        raise ValueError(f"need at least 2 images, got {images.shape[0]}")
    was_training, device = model.training, module_device(model)
    model.eval()
    out = []
    try:
        for T in its:
            coef: dict[str, list] = {}
            act: dict[str, list] = {}
            for k in range(0, images.shape[0], batch_size):
                x = float_images(images[k : k + batch_size]).to(device)
                traces = (model(x, return_routing=True, iterations=T).extra or {}).get("traces")
                if not traces:
                    raise ValueError(f"{type(model).__name__} gives no per-layer traces in extra['traces']")
                named = (
                    traces.items()
                    if isinstance(traces, dict)
                    else ((f"layer {i + 1}", t) for i, t in enumerate(traces))
                )
                for name, tr in named:
                    c = tr.coefficients[-1]
                    coef.setdefault(str(name), []).append(c.reshape(x.shape[0], -1, c.shape[-1]).cpu())
                    act.setdefault(str(name), []).append(_parent_activity(tr, x.shape[0]))
            for depth, name in enumerate(coef, start=1):
                c = torch.cat(coef[name])  # [N, children (x positions), n_out]
                st = coupling_stats(c)
                alive = None if act[name][0] is None else alive_share(torch.cat(act[name]), threshold)
                st = CouplingStats(st.entropy, st.max_share, st.variation, alive)
                out.append(LayerRouting(name, depth, T, c.shape[-1], st))
    finally:
        model.train(was_training)
    return out


def _parent_activity(trace: Any, batch: int) -> torch.Tensor | None:
    """A trace's parent activities ``[B, parents]`` on a [0, 1] scale: its last output activations (sigmoid of
    logits), else the lengths of its last outputs for a routing scored by lengths; ``None`` where it has neither."""
    scores = ROUTING_KINDS[trace.algorithm].scores
    if trace.activations:
        a = trace.activations[-1]
        a = torch.sigmoid(a) if scores == "logits" else a
    elif scores == "lengths":
        a = trace.outputs[-1].norm(dim=-1)  # capsule lengths
    else:
        return None
    return a.reshape(batch, -1).cpu()


@dataclass(frozen=True)
class ImageRouting:
    """One image routed by one network for each of ``iterations`` (see :func:`reroute_image`).

    Attributes
    ----------
    iterations : tuple of int
        The numbers of routing iterations ``T``.
    scores : torch.Tensor
        ``[len(iterations), K]``, the class scores for each ``T``, of kind ``score_kind``.
    score_kind : str
        ``"lengths"``, ``"activations"`` or ``"logits"``.
    couplings : torch.Tensor
        ``[len(iterations), n_inp, K]``, the couplings of the last iteration for each ``T``.
    entropy : tuple of float
        Per ``T``: the children's mean normalised coupling entropy (1: uniform).
    """

    iterations: tuple[int, ...]
    scores: torch.Tensor
    score_kind: str
    couplings: torch.Tensor
    entropy: tuple[float, ...]

    @property
    def predictions(self) -> list[int]:
        """The predicted class for each ``T``."""
        return self.scores.argmax(-1).tolist()


@torch.no_grad()
@checked
def reroute_image(
    model: nn.Module, image: torch.Tensor, iterations: Sequence[int] = tuple(range(1, 11))
) -> ImageRouting:
    """Route one ``image [C, H, W]`` through ``model`` (as for :func:`routing_changes`) with each of ``iterations``:
    the class scores and the couplings per ``T`` (what the chapter's iteration explorer draws)."""
    its = tuple(check_iterations(t) for t in iterations)
    contract = getattr(model, "input_contract", None)
    if contract is not None:
        check_images(image.unsqueeze(0), contract, "reroute_image: image (one image [C, H, W])", floating=False)
    was_training, device = model.training, module_device(model)
    model.eval()
    try:
        x = float_images(image.unsqueeze(0)).to(device)  # [1, C, H, W]
        outs = [model(x, return_routing=True, iterations=T) for T in its]
    finally:
        model.train(was_training)
    K = outs[0].scores.shape[-1]
    c = torch.stack([o.trace.coefficients[-1].reshape(-1, K).double().cpu() for o in outs])  # [T, n_inp, K]
    ent = -(c * c.clamp_min(1e-30).log()).sum(-1).mean(-1) / math.log(K)  # [T]
    return ImageRouting(its, torch.stack([o.scores[0].cpu() for o in outs]), outs[0].kind, c, tuple(ent.tolist()))


@checked
def gradient_by_layer(
    model: nn.Module, objective: Any, images: torch.Tensor, labels: torch.Tensor, layers: Sequence[str]
) -> dict[str, float]:
    """The root-mean-square gradient of the loss with respect to the weights of each submodule named in ``layers``
    (``model.get_submodule`` names, image side first), on one batch in training mode: how much learning signal
    reaches each depth (Mitterreiter et al.'s vanishing gradient). ``objective(model, (x, y), True)`` gives the
    loss (:class:`~capsule_lib.losses.ScoreObjective`); the model's gradients are cleared afterwards."""
    known = dict(model.named_modules())
    unknown = [name for name in layers if name not in known]
    if not layers or unknown:
        raise ValueError(
            f"gradient_by_layer: layers must name submodules of the model, got {unknown or list(layers)}; e.g. "
            f"{[n for n in known if n][:4]}"
        )
    was_training, device = model.training, module_device(model)
    model.train()
    try:
        model.zero_grad()
        x = float_images(images).to(device)
        objective(model, (x, labels.to(device)), True).loss.backward()
        out = {}
        for name in layers:
            g = [p.grad.detach().flatten() for p in model.get_submodule(name).parameters() if p.grad is not None]
            if not g:
                raise ValueError(f"layer {name!r} received no gradient")
            out[name] = torch.cat(g).double().pow(2).mean().sqrt().item()
    finally:
        model.zero_grad()
        model.train(was_training)
    return out


@checked
def first_pass_rows() -> list[list[str]]:
    """Section 1's check, in float64 on random capsules (4 images, 32 -> 10 capsules of 16): each routing's one pass
    with uniform couplings against its first iteration, the largest absolute difference (self-attention: no
    iterations); EM's fixed-coupling pass at its first iteration's inverse temperature, its default being its last's."""
    torch.manual_seed(0)
    u, a = torch.randn(4, 32, 16, dtype=torch.float64), torch.randn(4, 32, dtype=torch.float64)
    rows = []
    for kind, spec in ROUTING_KINDS.items():
        layer = spec.build(32, 10, 16, None, "routed").double()
        if hasattr(layer, "coupled_temperature"):
            layer.coupled_temperature = "first"  # the first iteration's (the default: its last iteration's)
        poses, acts = (u if spec.squash is None else spec.squash(u)), spec.input_activations(a)
        fixed = layer.route(poses, acts, couplings="uniform").poses
        first = layer.route(poses, acts, iterations=1).poses if DEFAULT_ITERATIONS[kind] else None
        rows.append([SHORT_LABELS[kind], "no iterations" if first is None else f"{(fixed - first).abs().max():.1e}"])
    return rows


@checked
def change_headers(data: str) -> list[str]:
    """The columns of :func:`change_rows` for a test set named ``data``."""
    at = ["own T", f"{data}: accuracy at T=1", "at own T", "at T=10", "changed at own T", "at T=10"]
    return ["routing", *at, "entropy at T=1 → own → 10"]


@checked
def change_rows(changes: dict[str, Any]) -> list[list[Any]]:
    """Section 2's table, one row per network of ``changes`` (routing kind ->
    :func:`~capsule_lib.critique.routing_changes`): its own ``T``, the accuracy at ``T = 1``, its own ``T`` and the
    last, the predictions changed from one pass at its own ``T`` and the last, and the couplings' entropy."""
    rows = []
    for kind, ch in changes.items():
        own = ch.iterations.index(ch.default)
        rows.append(
            [
                SHORT_LABELS[kind],
                ch.default,
                *(f"{100 * ch.accuracy[t]:.2f} %" for t in (0, own, -1)),
                *(f"{100 * ch.changed_from_first[t]:.1f} %" for t in (own, -1)),
                " → ".join(f"{ch.stats[t].entropy:.2f}" for t in (0, own, -1)),
            ]
        )
    return rows
