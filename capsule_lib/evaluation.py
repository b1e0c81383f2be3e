"""Evaluation helpers shared by the chapters: batched prediction, accuracy, MultiMNIST metrics, test-time
iteration sweeps, and EM routing evaluated literally (:func:`em_routing_naive`, the EM chapter's comparison)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from ._checks import (
    check_class_labels,
    check_device,
    check_image_range,
    check_image_values,
    check_images,
    check_iterations,
    check_tensor,
    module_device,
)
from ._contracts import checked
from .data.image_files import FileImages
from .routing.em import _check_em_inputs, _lambdas, em_routing

__all__ = [
    "predict",
    "accuracy",
    "accuracy_standard_error",
    "multimnist_accuracy",
    "confusion_matrix",
    "viewpoint_accuracies",
    "iteration_sweep",
    "em_routing_naive",
    "compare_with_naive",
]


@torch.no_grad()
@checked
def predict(
    model: nn.Module,
    images: torch.Tensor | np.ndarray | FileImages | str | os.PathLike | Sequence[str | os.PathLike],
    batch_size: int = 256,
    device: str | torch.device | None = None,
    keep_poses: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Run ``model`` over ``images`` (``uint8`` or float ``[N, C, H, W]``, a tensor or a NumPy array; or image files
    and folders) in batches, in eval mode; the model is given back in the mode it was in (a training loop that calls
    ``predict`` goes on with dropout), each submodule's as it was.

    Files (a path, or a list of paths; a folder stands for its image files,
    :func:`~capsule_lib.data.image_files.list_image_files`) are read as a folder's images are for training
    (:func:`~capsule_lib.data.image_files.read_image`: grey or RGB as the model's ``input_contract`` says, the shorter
    side resized to its size, the middle square kept); the result then also has ``"files"``, in the order read.

    The batches are moved to ``device`` (default: the device of the model's parameters). The model itself is
    never moved: if ``device`` differs from the model's device, a one-line :class:`ValueError` says so.
    ``uint8`` images are scaled to [0, 1]. Each batch is checked against the model's ``input_contract``
    (:class:`~capsule_lib.types.ImageContract`: shape, value range, finite values; a model without one is checked
    for finite values only), so 0-255 floats, mean/std-normalised input to a [0, 1] model, NaN or inf pixels and an
    empty ``images`` are refused with one line each.

    Returns ``{"scores": [N, K]}`` (capsule lengths or logits), ``"kind"`` (what the scores are:
    :attr:`~capsule_lib.types.CapsuleOutput.kind`), and ``"poses"`` ``[N, K, D]`` when ``keep_poses`` and the
    model returns capsules.
    """
    name = f"predict({type(model).__name__})"
    files = None
    if isinstance(images, (str, os.PathLike)) or (
        isinstance(images, (list, tuple)) and images and all(isinstance(p, (str, os.PathLike)) for p in images)
    ):
        images, files = _read_files(model, images, name)
    if isinstance(images, np.ndarray):
        images = torch.from_numpy(images)
    if isinstance(images, FileImages):  # image files read while training
        images = images.load()
    if not isinstance(images, torch.Tensor):
        raise ValueError(
            f"{name}: images must be a torch.Tensor or a numpy array [N, C, H, W], got {type(images).__name__}"
        )
    if images.dim() == 0 or images.shape[0] == 0:
        raise ValueError(f"{name}: no images to predict (images of shape {tuple(images.shape)})")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"{name}: batch_size must be a positive integer, got {batch_size!r}")
    here = module_device(model)
    device = here if device is None else check_device(device, name)
    if device.type != here.type or (device.index is not None and here.index is not None and device != here):
        raise ValueError(
            f"predict: the model is on {here} but device={str(device)!r}; move the model first "
            f"(model.to({str(device)!r})) or leave device unset"
        )
    contract = getattr(model, "input_contract", None)
    if contract is not None:  # the whole input's shape (uint8 or float), before any batch runs
        check_images(images, contract, f"{name}: images", floating=False)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        scores, poses, kind = _predict_batches(
            model, images, batch_size, device, keep_poses, progress, f"{name}: images"
        )
    finally:  # the model's own train() first (it may do more than set flags), then each submodule's mode as it was
        model.train(modes[0][1])
        for m, training in modes:
            m.training = training
    res: dict[str, Any] = {"scores": torch.cat(scores), "kind": kind}
    if poses:
        res["poses"] = torch.cat(poses)
    if files is not None:
        res["files"] = files
    return res


def _read_files(model: nn.Module, paths: Any, name: str) -> tuple[torch.Tensor, list[str]]:
    """:func:`predict`'s images from files, read at the model's channels and size."""
    from .data.image_files import list_image_files, read_images

    contract = getattr(model, "input_contract", None)
    if contract is None or contract.size is None:
        raise ValueError(
            f"{name}: reading image files needs a model whose input_contract gives a channel count "
            f"and a size; pass the images as a tensor [N, C, H, W]"
        )
    files = list_image_files(paths)
    return read_images(files, contract.size, contract.channels), files


def _predict_batches(
    model: nn.Module, images: torch.Tensor, batch_size: int, device: torch.device, keep: bool, progress: bool, name: str
) -> tuple[list[torch.Tensor], list[torch.Tensor], str]:
    """:func:`predict`'s loop: each batch on ``device``, its values checked, its scores (and poses) on the CPU, and
    what the scores are (``CapsuleOutput.kind``; ``"logits"`` for a plain tensor)."""
    contract = getattr(model, "input_contract", None)
    scores, poses, kind = [], [], "logits"
    rng = range(0, images.shape[0], batch_size)
    if progress:
        from ._progress import progress as bar

        rng = bar(rng, desc="predict")
    for lo in rng:
        x = images[lo : lo + batch_size].to(device)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        if contract is not None:
            check_image_values(x, contract, name)
        else:
            check_image_range(x, None, None, name)
        out: Any = model(x)
        s = out if isinstance(out, torch.Tensor) else out.scores
        kind = "logits" if isinstance(out, torch.Tensor) else out.kind
        scores.append(s.float().cpu())
        if keep and not isinstance(out, torch.Tensor):
            poses.append(out.poses.float().cpu())
    return scores, poses, kind


@checked
def accuracy(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 accuracy of ``scores [N, K]`` against ``labels [N]``; a label outside ``0 .. K-1`` (a wrong or corrupt
    label set: it would count as an error and lower the accuracy silently) is refused in one line."""
    check_tensor(scores, "accuracy: scores", "[N, K]", [None, None])
    check_class_labels(labels, scores.shape[-1], "accuracy", n=scores.shape[0])
    return (scores.argmax(1) == labels.to(scores.device)).float().mean().item()


@checked
def accuracy_standard_error(p: float, n: int) -> float:
    """The binomial standard error of an accuracy ``p`` measured on ``n`` images, ``sqrt(p (1 - p) / n)`` (a
    fraction; at least ``1e-6 / sqrt(n)``, so an accuracy of exactly 0 or 1 still has one)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"accuracy_standard_error: p must be an accuracy in [0, 1], got {p!r}")
    if n < 1:
        raise ValueError(f"accuracy_standard_error: n must be a number of images >= 1, got {n!r}")
    return math.sqrt(max(p * (1 - p), 1e-12) / max(n, 1))


@checked
def multimnist_accuracy(scores: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
    """Two metrics for two-digit images, ``labels [N, 2]``, predictions = the top-2 scores.

    * ``both_correct``: Sabour et al.'s metric, an image counts only if both digits are found.
    * ``per_digit``: Efficient-CapsNet's ``multiAccuracy``, the share of the two digits found (0, 1/2, 1).
    """
    check_tensor(scores, "multimnist_accuracy: scores", "[N, K >= 2]", [None, None])
    if scores.shape[1] < 2:
        raise ValueError(f"multimnist_accuracy: scores must have K >= 2 classes, got {tuple(scores.shape)}")
    check_tensor(
        labels, "multimnist_accuracy: labels", f"[N={scores.shape[0]}, 2]", [scores.shape[0], 2], floating=False
    )
    for k in range(2):
        check_class_labels(labels[:, k], scores.shape[1], "multimnist_accuracy", n=scores.shape[0])
    top2 = scores.topk(2, dim=1).indices  # [N, 2]
    hit = (top2[:, :, None] == labels[:, None, :].to(top2.device)).any(1)  # [N, 2]: is label k among top-2
    return {"both_correct": hit.all(1).float().mean().item(), "per_digit": hit.float().mean().item()}


def confusion_matrix(pred: torch.Tensor, labels: torch.Tensor, n_classes: int) -> torch.Tensor:
    """``[n_classes, n_classes]`` counts, rows = true class, columns = prediction."""
    idx = labels.long() * n_classes + pred.long()
    return torch.bincount(idx, minlength=n_classes * n_classes).view(n_classes, n_classes)


@checked
def viewpoint_accuracies(model: nn.Module, sets: Any, device: str | torch.device | None = None) -> dict[str, float]:
    """Test accuracy of ``model`` on the familiar and the novel views of a viewpoint protocol
    (:class:`~capsule_lib.data.viewpoints.ViewpointSets`): ``{"familiar": ..., "novel": ..., "drop": familiar -
    novel}``."""
    acc = {
        g: accuracy(predict(model, getattr(sets, g).images, device=device)["scores"], getattr(sets, g).labels)
        for g in ("familiar", "novel")
    }
    return {**acc, "drop": acc["familiar"] - acc["novel"]}


@torch.no_grad()
@checked
def iteration_sweep(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    iterations: Sequence[int] = (1, 2, 3, 4),
    settings: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 250,
) -> list[dict[str, Any]]:
    """Accuracy and forward time of a routing model at test time for every number of ``iterations`` and every
    named setting (extra keyword arguments of the model's ``forward``, e.g. ``{"concurrent": {"sequential":
    False}, "sequential": {"sequential": True}}``; default: one setting, ``"model"``, with none).
    ``model(x, iterations=T, **kwargs)`` must accept ``iterations``.

    Returns one dict per (setting, T): ``setting``, ``iterations``, ``accuracy``, ``ms_per_image`` (wall clock of
    the whole pass over ``images`` divided by their number, measured after one warm-up batch) and ``n``."""
    import time

    settings = settings or {"model": {}}
    its = tuple(check_iterations(t) for t in iterations)
    if not its:
        raise ValueError("iteration_sweep: iterations must name at least one number of iterations, got ()")
    check_tensor(images, "iteration_sweep: images", "[N, C, H, W]", [None, None, None, None], floating=False)
    check_class_labels(labels, 1 << 30, "iteration_sweep", n=images.shape[0])
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"iteration_sweep: batch_size must be an integer >= 1, got {batch_size!r}")
    device = module_device(model)
    model.eval()
    rows = []
    for name, kwargs in settings.items():
        for T in its:
            x0 = images[:batch_size].to(device)
            model(x0.float() / 255 if x0.dtype == torch.uint8 else x0, iterations=T, **kwargs)  # warm-up
            correct, t0 = 0, time.perf_counter()
            for lo in range(0, images.shape[0], batch_size):
                x = images[lo : lo + batch_size].to(device)
                x = x.float() / 255 if x.dtype == torch.uint8 else x
                pred = model(x, iterations=T, **kwargs).scores.argmax(-1).cpu()
                correct += int((pred == labels[lo : lo + batch_size]).sum())
            dt = time.perf_counter() - t0
            n = images.shape[0]
            rows.append(
                {"setting": name, "iterations": T, "accuracy": correct / n, "ms_per_image": 1000 * dt / n, "n": n}
            )
    return rows


def em_routing_naive(
    votes: torch.Tensor,
    a_in: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    *,
    inverse_temperature: float | Sequence[float] | None = None,
    normalize_costs: bool = True,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """**Reference for teaching, not for use**: EM routing's Procedure 1 evaluated literally, in probability space
    and in the votes' own dtype. Same arguments and results as :func:`~capsule_lib.routing.em.em_routing` (without
    the trace and the yl-1993 option), same ``eps`` guards in the M-step; only the numerics differ:

    * ``sigma = sqrt(sigma2)`` and ``cost_h = (beta_u + log sigma) * sum_i R'_ij``;
    * ``a_j = 1 / (1 + exp(-lambda (beta_a - sum_h cost_h)))``;
    * E-step: ``p_ij = prod_h exp(-(V_ijh - mu_jh)^2 / (2 sigma2_jh)) / sqrt(2 pi sigma2_jh)`` (a product of
      ``d`` densities) and ``R_ij = a_j p_ij / sum_k a_k p_ik``;
    * no upcast: fp16/bf16 votes are routed in fp16/bf16, as they would be under autocast.

    With tight clusters, large poses, many iterations or half precision the product of densities
    under- or overflows, and ``0/0`` or ``inf/inf`` in the E-step gives NaN. The EM chapter puts it next to
    :func:`~capsule_lib.routing.em.em_routing` on the same inputs (:func:`compare_with_naive`).

    Parameters
    ----------
    votes, a_in : torch.Tensor
        ``votes [..., n_inp, n_out, d]`` and input activations ``a_in [..., n_inp]``.
    beta_u, beta_a : torch.Tensor
        ``[n_out]`` each: the cost offset per pose entry and the activation threshold.
    iterations : int
        Routing iterations T, >= 1.
    inverse_temperature, normalize_costs, eps
        As in :func:`~capsule_lib.routing.em.em_routing`.

    Returns
    -------
    tuple of torch.Tensor
        ``(mu [..., n_out, d], a_out [..., n_out])`` of the last M-step, in the votes' dtype (NaN where the
        probability-space E-step broke down).
    """
    _check_em_inputs(votes, a_in, beta_u, beta_a)
    lams = _lambdas(inverse_temperature, iterations)
    *_, I, J, D = votes.shape
    scale = J / I if normalize_costs else 1.0
    dt = votes.dtype
    with torch.autocast(device_type=votes.device.type, enabled=False):
        V = votes.transpose(-3, -2)  # [B, J, I, D]
        a = a_in.to(dt).unsqueeze(-2)  # [B, 1, I]
        bu, ba = beta_u.to(dt).unsqueeze(-1), beta_a.to(dt)  # [J, 1], [J]
        R = torch.full_like(V[..., 0], 1.0 / J)  # [B, J, I]
        for t in range(iterations):
            # ---- M-step ----
            Rp = R * a  # [B, J, I]
            mass = Rp.sum(dim=-1)  # [B, J]
            coeff = Rp / (mass.unsqueeze(-1) + eps)  # [B, J, I]
            mu = (coeff.unsqueeze(-1) * V).sum(dim=-2)  # [B, J, D]
            sigma2 = (coeff.unsqueeze(-1) * (V - mu.unsqueeze(-2)) ** 2).sum(dim=-2) + eps  # [B, J, D]
            sigma = torch.sqrt(sigma2)  # [B, J, D]
            cost = ((bu + torch.log(sigma)) * (mass * scale).unsqueeze(-1)).sum(dim=-1)  # [B, J]
            a_out = 1.0 / (1.0 + torch.exp(-lams[t] * (ba - cost)))  # [B, J]
            if t == iterations - 1:
                break
            # ---- E-step (probability space) ----
            dens = torch.exp(-((V - mu.unsqueeze(-2)) ** 2) / (2 * sigma2.unsqueeze(-2)))  # [B, J, I, D]
            dens = dens / torch.sqrt(2 * math.pi * sigma2.unsqueeze(-2))  # [B, J, I, D]
            p = dens.prod(dim=-1)  # [B, J, I]
            ap = a_out.unsqueeze(-1) * p  # [B, J, I]
            R = ap / ap.sum(dim=-2, keepdim=True)  # [B, J, I]  sums to 1 over j (or is NaN)
    return mu, a_out


@checked
def compare_with_naive(
    votes: torch.Tensor,
    a_in: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    **routing,
) -> dict[str, float]:
    """Route the same inputs with :func:`~capsule_lib.routing.em.em_routing` (log space) and
    :func:`em_routing_naive` (probability space)
    and report, per sample of the batch: the share of samples whose poses or activations are not all finite for
    each (``"naive_nonfinite"``, ``"log_space_nonfinite"``), and the largest absolute difference of the
    activations over the samples where both are finite (``"max_activation_diff"``, NaN if there are none).
    ``routing``: ``inverse_temperature``, ``normalize_costs``, ``eps``."""

    def bad(mu: torch.Tensor, a: torch.Tensor) -> torch.Tensor:  # [B]: any non-finite output in the sample
        lead = a.shape[:1]
        return ~(
            torch.isfinite(mu.float()).reshape(*lead, -1).all(-1) & torch.isfinite(a.float()).reshape(*lead, -1).all(-1)
        )

    with torch.no_grad():
        mu, a = em_routing(votes, a_in, beta_u, beta_a, iterations, **routing)
        mu_n, a_n = em_routing_naive(votes, a_in, beta_u, beta_a, iterations, **routing)
    b_ours, b_naive = bad(mu, a), bad(mu_n, a_n)
    both = ~(b_ours | b_naive)
    diff = (a.float() - a_n.float()).abs().reshape(a.shape[0], -1)[both]
    return {
        "naive_nonfinite": float(b_naive.float().mean()),
        "log_space_nonfinite": float(b_ours.float().mean()),
        "max_activation_diff": float(diff.max()) if diff.numel() else float("nan"),
    }
