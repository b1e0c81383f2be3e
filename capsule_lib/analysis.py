"""What the book's figures show, computed: toy routing problems and sweeps, routing traces and model runs.

The split between the two modules: :mod:`capsule_lib.analysis` computes, ``capsule_lib.viz`` draws. Every
function here builds a problem, runs a routing function or a model (without gradients), or reduces a trace to
the numbers a figure needs, and returns tensors, arrays or traces; the figure functions and widgets of
``capsule_lib.viz`` take those results and never call a model or a routing function themselves (an
interactive explorer that must recompute for a slider's value calls a function of this module).

- the primer's toy problems: :class:`ToyVotes`, :func:`toy_votes`, :func:`group_shares`, :func:`outlier_sweep`;
- capsule classifiers: :func:`decode_poses` (reconstructions of perturbed poses);
- matrix capsules with EM routing: :func:`em_class_inputs`, :func:`em_class_trace`;
- Heinsen routing: :func:`class_poses`, :class:`PoseProjection`, :func:`pose_projection`, :func:`credit_maps`,
  :func:`class_credit_maps`;
- inverted dot-product attention routing: :func:`grid_geometry`, :func:`class_attention_maps`,
  :func:`expansion_sources`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ._checks import check_tensor, float_images, module_device
from ._contracts import checked
from .functional import capsule_lengths
from .routing.dynamic import dynamic_routing
from .routing.inverted import conv_windows
from .types import RoutingTrace

__all__ = [
    "PARENT_NAMES",
    "ToyVotes",
    "toy_votes",
    "group_shares",
    "outlier_sweep",
    "decode_poses",
    "capsule_grid",
    "em_class_inputs",
    "em_class_trace",
    "class_poses",
    "PoseProjection",
    "pose_projection",
    "credit_maps",
    "class_credit_maps",
    "grid_geometry",
    "class_attention_maps",
    "expansion_sources",
]

#: the names of a toy problem's parents, in order
PARENT_NAMES = "ABCDEFGH"


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().float().cpu().numpy()


# ------------------------------------------------------------------------------------- toy routing problems
@dataclass
class ToyVotes:
    """Votes of a toy routing problem.

    Attributes
    ----------
    votes : torch.Tensor
        ``[B, n_inp, n_out, 2]``, the vote of child ``i`` for parent ``j``.
    group : torch.Tensor
        ``[n_inp]``, the parent each child agrees on (``-1`` for outliers).
    centers : torch.Tensor
        ``[n_out, 2]``, the pose each group of children agrees on.
    """

    votes: torch.Tensor
    group: torch.Tensor
    centers: torch.Tensor

    @property
    def n_children(self) -> int:
        """The number of children ``n_inp``."""
        return self.votes.shape[1]

    @property
    def n_parents(self) -> int:
        """The number of parents ``n_out``."""
        return self.votes.shape[2]

    def parent_names(self) -> list[str]:
        """``["A", "B", ...]``, one name per parent."""
        return list(PARENT_NAMES[: self.n_parents])

    def child_labels(self) -> list[str]:
        """``"A1"``, ``"A2"``, ... for group members, ``"o1"``, ... for outliers."""
        counts: dict[int, int] = {}
        out = []
        for g in self.group.tolist():
            counts[g] = counts.get(g, 0) + 1
            out.append(f"{PARENT_NAMES[g] if g >= 0 else 'o'}{counts[g]}")
        return out


@checked
def toy_votes(
    groups: Sequence[int] = (5, 3),
    n_outliers: int = 2,
    spread: float = 0.12,
    length: float = 0.9,
    outlier_length: tuple[float, float] = (0.3, 1.1),
    batch: int = 1,
    seed: int = 0,
) -> ToyVotes:
    """Votes from ``sum(groups) + n_outliers`` children for ``len(groups)`` parents.

    The ``groups[j]`` children of group ``j`` vote for parent ``j`` near a common pose (a vector of length
    ``length`` at angle ``2*pi*j/len(groups) + 0.5``), with Gaussian noise ``spread``; all their other
    votes, and every vote of an outlier, point in uniformly random directions with lengths uniform in
    ``outlier_length``. Deterministic for a given ``seed``; ``batch`` independent draws share the groups.

    Parameters
    ----------
    groups : Sequence[int]
        The size of each group of children (one group per parent; a group may be empty).
    n_outliers : int
        Children that agree with nobody.
    spread : float
        Standard deviation of the noise of a group's votes around its parent's pose.
    length : float
        Length of the poses the groups agree on.
    outlier_length : tuple of float
        ``(low, high)`` of the uniform lengths of the random votes.
    batch : int
        Independent draws of the votes.
    seed : int
        Seed of the draws.

    Returns
    -------
    ToyVotes
        The votes ``[batch, n_inp, n_out, 2]``, each child's group and the groups' poses.
    """
    if len(groups) < 1 or any(g < 0 for g in groups):
        raise ValueError(f"toy_votes: groups must be non-negative sizes, at least one group, got {tuple(groups)}")
    if n_outliers < 0:
        raise ValueError(f"toy_votes: n_outliers must be >= 0, got {n_outliers}")
    if spread < 0 or length <= 0 or not 0 <= outlier_length[0] <= outlier_length[1]:
        raise ValueError(
            f"toy_votes: need spread >= 0, length > 0 and 0 <= low <= high outlier_length, got spread={spread}, "
            f"length={length}, outlier_length={tuple(outlier_length)}"
        )
    if batch < 1:
        raise ValueError(f"toy_votes: batch must be >= 1, got {batch}")
    n_out = len(groups)
    n_inp = sum(groups) + n_outliers
    if n_inp < 1:
        raise ValueError(f"toy_votes: groups and n_outliers give no child, got {tuple(groups)}, {n_outliers}")
    g = torch.Generator().manual_seed(seed)
    group = torch.tensor([j for j, k in enumerate(groups) for _ in range(k)] + [-1] * n_outliers)  # [I]
    angles = torch.arange(n_out, dtype=torch.float32) * (2 * np.pi / n_out) + 0.5
    centers = length * torch.stack([angles.cos(), angles.sin()], dim=-1)  # [J, 2]
    lo, hi = outlier_length
    theta = torch.rand(batch, n_inp, n_out, generator=g) * (2 * np.pi)
    radius = lo + (hi - lo) * torch.rand(batch, n_inp, n_out, generator=g)
    votes = radius.unsqueeze(-1) * torch.stack([theta.cos(), theta.sin()], dim=-1)  # [B, I, J, 2] scattered
    noise = spread * torch.randn(batch, n_inp, 2, generator=g)  # [B, I, 2]
    for j in range(n_out):  # loop over parents (2-3), not over capsules
        members = group == j  # [I]
        votes[:, members, j] = centers[j] + noise[:, members]
    return ToyVotes(votes, group, centers)


def group_shares(toy: ToyVotes, trace: RoutingTrace, t: int, sample: int = 0) -> np.ndarray:
    """Mean coefficient each group of children sends to each parent in iteration ``t``.

    Parameters
    ----------
    toy : ToyVotes
        The problem that was routed.
    trace : RoutingTrace
        Its routing trace (``return_routing=True``).
    t : int
        The iteration, 1-based.
    sample : int
        Which problem of the batch.

    Returns
    -------
    numpy.ndarray
        ``[n_groups (+1 row for outliers, if any), n_out]``; rows follow ``toy.group`` values 0, 1, ..., -1.
    """
    c = _np(trace.coefficients[t - 1][sample])  # [I, J]
    grp = toy.group.numpy()
    keys = sorted(k for k in set(grp.tolist()) if k >= 0) + ([-1] if (grp < 0).any() else [])
    return np.stack([c[grp == k].mean(axis=0) for k in keys])


@checked
def outlier_sweep(
    n_outliers: Sequence[int] = tuple(range(0, 13, 2)),
    group: int = 4,
    iterations: Sequence[int] = (1, 3),
    problems: int = 500,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, np.ndarray]:
    """Mean parent lengths when one group of ``group`` children agrees on parent A, nobody agrees on B,
    and ``m`` outliers vote at random, for each ``m`` in ``n_outliers``.

    For every ``m``, ``problems`` random problems (one batch) are routed with plain and leaky dynamic
    routing for each number of ``iterations``.

    Parameters
    ----------
    n_outliers : Sequence[int]
        The numbers of outliers ``m``.
    group : int
        The size of the group that agrees on parent A.
    iterations : Sequence[int]
        The numbers of routing iterations.
    problems : int
        Random problems per number of outliers.
    seed : int
        The problems for ``m`` outliers are drawn with seed ``seed + m``.
    progress : bool
        Show a ``tqdm.auto`` bar.

    Returns
    -------
    dict
        ``{"n_outliers": [M], "iterations": [T], "leaky": [2], "lengths": [M, 2 (plain, leaky), T, 2 (A, B)]}``.
    """
    from tqdm.auto import tqdm

    if group < 1:
        raise ValueError(f"outlier_sweep: group must be >= 1 child, got {group}")
    if problems < 1:
        raise ValueError(f"outlier_sweep: problems must be >= 1, got {problems}")
    ms, its = list(n_outliers), list(iterations)
    out = np.zeros((len(ms), 2, len(its), 2))
    for a, m in enumerate(tqdm(ms, desc="outlier counts", disable=not progress)):
        toy = toy_votes(groups=(group, 0), n_outliers=m, batch=problems, seed=seed + m)
        for b, leaky in enumerate((False, True)):
            for k, T in enumerate(its):
                v = dynamic_routing(toy.votes, T, leaky=leaky)  # [P, 2, 2]
                out[a, b, k] = _np(capsule_lengths(v).mean(dim=0))  # [2]
    return {"n_outliers": np.array(ms), "iterations": np.array(its), "leaky": np.array([False, True]), "lengths": out}


# -------------------------------------------------------------------------------------- capsule classifiers
@torch.no_grad()
def decode_poses(model: torch.nn.Module, poses: torch.Tensor, label: int) -> torch.Tensor:
    """Reconstructions of class capsules, e.g. perturbed ones, by the model's decoder.

    Parameters
    ----------
    model : torch.nn.Module
        A classifier with a decoder (``model.reconstruct(poses, labels)``); it is never moved.
    poses : torch.Tensor
        ``[B, K, D]`` class capsules, brought to the model's device.
    label : int
        The class capsule the decoder reads (the others are masked).

    Returns
    -------
    torch.Tensor
        ``[B, C, H, W]`` reconstructions, on the CPU.
    """
    dev = module_device(model)
    y = torch.full((poses.shape[0],), label, dtype=torch.long, device=dev)
    return model.reconstruct(poses.to(dev), y).cpu()


@checked
def capsule_grid(model: torch.nn.Module) -> tuple[int, int, int]:
    """The layout of a network's primary capsules, ``(types, rows, columns)``, what the routing figures reshape
    couplings to (``grid=``): a :class:`~capsule_lib.models.CapsNet`'s (``(32, 6, 6)`` on 28 x 28 images) or a
    :class:`~capsule_lib.models.RoutingClassifier`'s, at whatever image size it was built for.

    Parameters
    ----------
    model : torch.nn.Module
        A CapsNet or a RoutingClassifier.

    Returns
    -------
    tuple of int
        ``(primary types, grid rows, grid columns)``.
    """
    cfg = model.config
    side = cfg.primary_grid if hasattr(cfg, "primary_grid") else cfg.grid
    return (cfg.primary_types, side, side)


# ------------------------------------------------------------------------------ matrix capsules, EM routing
@torch.no_grad()
def em_class_inputs(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The children of an :class:`~capsule_lib.models.EMCapsNet`'s class capsules, computed once, so that the
    class layer can be re-routed with other settings (:func:`em_class_trace`).

    Parameters
    ----------
    model : torch.nn.Module
        An :class:`~capsule_lib.models.EMCapsNet`.
    images : torch.Tensor
        ``[B, C, H, W]`` images, uint8 or float in [0, 1] (brought to the model's device).

    Returns
    -------
    poses : torch.Tensor
        ``[B, D, h, w, 16]`` poses of the last convolutional capsule layer.
    activations : torch.Tensor
        ``[B, D, h, w]`` its activations.
    """
    return model.class_inputs(float_images(images).to(module_device(model)))


@torch.no_grad()
def em_class_trace(
    model: torch.nn.Module,
    poses: torch.Tensor,
    activations: torch.Tensor,
    iterations: int | None = None,
    lambda_scale: float = 1.0,
) -> RoutingTrace:
    """EM routing of an :class:`~capsule_lib.models.EMCapsNet`'s class capsules, re-run with another number of
    iterations and inverse temperature (:meth:`~capsule_lib.models.EMCapsNet.route_classes`).

    Parameters
    ----------
    model : torch.nn.Module
        An :class:`~capsule_lib.models.EMCapsNet`.
    poses, activations : torch.Tensor
        The class layer's children, from :func:`em_class_inputs`.
    iterations : int, optional
        EM iterations; ``None`` uses the model's.
    lambda_scale : float
        The inverse temperature as a multiple of the model's ``final_lambda``.

    Returns
    -------
    RoutingTrace
        The routing's trace, detached.
    """
    (_, _), trace = model.route_classes(poses, activations, iterations, model.config.final_lambda * lambda_scale)
    return trace.detach()


# --------------------------------------------------------------------------------------------- Heinsen 2019
@torch.no_grad()
@checked
def class_poses(model: torch.nn.Module, images: torch.Tensor, batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Class probabilities and class-capsule poses of a :class:`~capsule_lib.models.SmallNORBClassifier`.

    Parameters
    ----------
    model : torch.nn.Module
        A :class:`~capsule_lib.models.SmallNORBClassifier`.
    images : torch.Tensor
        ``[N, 2, H, W]`` uint8 or [0, 1] float images.
    batch : int
        Images per forward pass.

    Returns
    -------
    probabilities : torch.Tensor
        ``[N, K]``, the softmax of the logits (float32, on the CPU).
    poses : torch.Tensor
        ``[N, K, 16]`` class-capsule poses (float32, on the CPU).
    """
    device = module_device(model)
    probs, poses = [], []
    for lo in range(0, images.shape[0], batch):
        out = model(float_images(images[lo : lo + batch]).to(device))
        probs.append(out.scores.float().softmax(-1).cpu())
        poses.append(out.poses.float().cpu())
    return torch.cat(probs), torch.cat(poses)


@dataclass
class PoseProjection:
    """A 2-D principal-component projection of pose vectors: ``apply(p [..., D]) -> [..., 2]``.

    Attributes
    ----------
    mean : torch.Tensor
        ``[D]``, the mean pose.
    components : torch.Tensor
        ``[2, D]``, the first two principal axes.
    explained : torch.Tensor
        ``[2]``, the fraction of the variance along each axis.
    """

    mean: torch.Tensor  # [D]
    components: torch.Tensor  # [2, D]
    explained: torch.Tensor  # [2] fraction of the variance along each axis

    def apply(self, poses: torch.Tensor) -> torch.Tensor:
        """Project ``poses [..., D]`` to ``[..., 2]``."""
        return (poses.float() - self.mean) @ self.components.T  # [..., 2]


@checked
def pose_projection(poses: torch.Tensor) -> PoseProjection:
    """The first two principal components of pose vectors.

    Parameters
    ----------
    poses : torch.Tensor
        ``[N, D]`` poses, ``N >= 2`` (more leading dimensions are flattened).

    Returns
    -------
    PoseProjection
        The projection onto the first two principal axes.
    """
    p = poses.float().reshape(-1, poses.shape[-1])
    if p.shape[0] < 2:
        raise ValueError(f"poses: need at least 2 pose vectors for a projection, got {p.shape[0]}")
    mean = p.mean(0)
    _, s, vh = torch.linalg.svd(p - mean, full_matrices=False)
    var = s**2
    return PoseProjection(mean, vh[:2], var[:2] / var.sum().clamp_min(1e-12))


@checked
def credit_maps(credits: torch.Tensor) -> torch.Tensor:
    """Credit summed over the part types at each position.

    Parameters
    ----------
    credits : torch.Tensor
        ``[..., K, n_parts, h, w]``, from :meth:`~capsule_lib.models.SmallNORBClassifier.class_credits`.

    Returns
    -------
    torch.Tensor
        ``[..., K, h, w]`` float32 maps.
    """
    check_tensor(credits, "credit_maps: credits", "[..., K, n_parts, h, w]", [None, None, None, None], min_leading=0)
    return credits.float().sum(-3)


@torch.no_grad()
def class_credit_maps(model: torch.nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which part capsules each class capsule of a :class:`~capsule_lib.models.SmallNORBClassifier` explains,
    after every iteration of its class routing (:func:`credit_maps` of its ``class_credits``).

    Parameters
    ----------
    model, images : torch.nn.Module, torch.Tensor
        As for :func:`class_poses`: the classifier and its ``[N, 2, H, W]`` images.

    Returns
    -------
    maps : torch.Tensor
        ``[N, T, K, h, w]`` credit maps, ``T`` the model's class-routing iterations (on the CPU).
    probabilities : torch.Tensor
        ``[N, K]`` class probabilities, the softmax of the logits (on the CPU).
    """
    x = float_images(images).to(module_device(model))
    maps = []
    for t in range(model.config.iterations):
        out, credits = model.class_credits(x, t)
        maps.append(credit_maps(credits).cpu())  # [N, K, h, w]
    return torch.stack(maps, 1), out.scores.float().softmax(-1).cpu()


# ------------------------------------------------------------------------- inverted dot-product attention
@checked
def grid_geometry(model: torch.nn.Module) -> list[tuple[float, float, int]]:
    """Where the capsule grids of a :class:`~capsule_lib.models.CapsModel` sit over its input, for drawing.

    Parameters
    ----------
    model : torch.nn.Module
        A :class:`~capsule_lib.models.CapsModel`.

    Returns
    -------
    list of tuple
        For the primary grid, then each CONV capsule layer: ``(first centre, spacing, side)`` in input pixels
        (pixel ``i`` has centre ``i``): the receptive field of grid cell ``h`` is centred at
        ``first + h * spacing``.
    """
    cfg = model.config
    stride = cfg.backbone_stride
    a, b, side = float(stride), (stride - 1) / 2.0, cfg.backbone_grid  # centre(h) = a h + b
    out = [(b, a, side)]
    for layer in model.capsule_layers:
        if not hasattr(layer, "kernel_size"):
            break
        k, s = layer.kernel_size, layer.stride
        b, a, side = a * (k - 1) / 2.0 + b, a * s, layer.output_size(side)
        out.append((b, a, side))
    return out


@torch.no_grad()
@checked
def class_attention_maps(
    model: torch.nn.Module, images: torch.Tensor, iterations: int | None = None, sequential: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing probabilities from the last CONV capsule layer of a :class:`~capsule_lib.models.CapsModel` into
    the class capsules, as maps over the grid.

    ``maps[n, t, k, y, x]`` is the mean over the capsule types at grid position ``(y, x)`` of ``r_{i -> k}``,
    the share of child ``i``'s vote that goes to class ``k`` in the class layer's ``t``-th update (``t = 0``
    is the uniform first pass: ``1/K`` everywhere); ``probabilities[:, t]`` is the softmax of the logits of the
    class poses after update ``t + 1`` (the last one is the model's output).

    Parameters
    ----------
    model : torch.nn.Module
        A :class:`~capsule_lib.models.CapsModel` with at least one CONV capsule layer.
    images : torch.Tensor
        ``[N, C, H, W]`` uint8 or [0, 1] float images.
    iterations, sequential : optional
        As in :meth:`~capsule_lib.models.CapsModel.forward`.

    Returns
    -------
    maps : torch.Tensor
        ``[N, T, K, h, w]`` (float32, on the CPU).
    probabilities : torch.Tensor
        ``[N, T, K]`` (float32, on the CPU).
    """
    x = float_images(images).to(module_device(model))
    out = model(x, return_routing=True, iterations=iterations, sequential=sequential)
    last = [layer for layer in model.capsule_layers if hasattr(layer, "kernel_size")]
    if not last:
        raise ValueError("class_attention_maps needs a model with at least one CONV capsule layer")
    side = grid_geometry(model)[-1][2]
    n_types = last[-1].n_out
    maps = []
    for r in out.trace.coefficients:  # [N, n_types*h*w, K] per update, type-major children
        r = r.float().reshape(r.shape[0], n_types, side, side, r.shape[-1])  # [N, types, h, w, K]
        maps.append(r.mean(1).permute(0, 3, 1, 2))  # [N, K, h, w]
    probs = [model.final_fc(p).squeeze(-1).float().softmax(-1) for p in out.trace.outputs]  # [N, K] per update
    return torch.stack(maps, 1).cpu(), torch.stack(probs, 1).cpu()


def expansion_sources(
    size: int, kernel_size: int, stride: int, d: int, expansion: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where each value of :func:`~capsule_lib.routing.inverted.conv_windows` comes from, on a ``size x size``
    grid of one capsule type with ``d`` pose entries.

    Parameters
    ----------
    size : int
        The side of the input grid.
    kernel_size, stride : int
        The window's size and stride.
    d : int
        Pose entries per cell.
    expansion : str
        ``"unfold"`` (correct) or ``"official_bug"`` (the official ``input_expansion``).

    Returns
    -------
    rows, cols, entries : torch.Tensor
        Each ``[k, k, h_out, w_out, d]``: the input row, column and pose entry read for window offset
        ``(k, l)``, output position ``(h, w)`` and pose entry ``e``.
    """
    ids = torch.arange(size * size * d, dtype=torch.float64).view(1, 1, size, size, d)  # id = (y*size + x)*d + e
    win = conv_windows(ids, kernel_size, stride, expansion)[0, 0].long()  # [k, k, h, w, d]
    return win // d // size, win // d % size, win % d
