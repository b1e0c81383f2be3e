"""Losses of the capsule papers: margin (Sabour 2017 / Mazzia 2021), spread (Hinton 2018),
reconstruction, and soft-target cross-entropy (Heinsen 2019, used with mixup); and the training objectives
(``*Objective``) that apply them to a model's output for one batch, returning a :class:`StepOutput`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_tensor
from ._contracts import checked

__all__ = [
    "one_hot",
    "margin_loss",
    "reconstruction_loss",
    "reconstruction_target",
    "spread_loss",
    "spread_margin",
    "soft_target_cross_entropy",
    "MarginLoss",
    "ReconstructionLoss",
    "SpreadLoss",
    "SoftTargetCrossEntropy",
    "StepOutput",
    "ClassifierObjective",
    "CapsuleObjective",
    "SpreadObjective",
    "ScoreObjective",
    "MultiDigitObjective",
]


def one_hot(y: torch.Tensor, n_classes: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Integer labels ``[B]`` -> one-hot ``[B, n_classes]``; a ``[B, n_classes]`` (multi-)hot input passes through."""
    if y.dim() == 2:
        if y.shape[1] != n_classes:
            raise ValueError(f"targets: expected [B] labels or [B, {n_classes}] (multi-)hot, got {tuple(y.shape)}")
        return y.to(dtype)
    if y.dim() != 1:
        raise ValueError(f"targets: expected [B] labels or [B, {n_classes}] (multi-)hot, got {tuple(y.shape)}")
    return F.one_hot(y.long(), n_classes).to(dtype)


def margin_loss(
    lengths: torch.Tensor,
    targets: torch.Tensor,
    m_pos: float = 0.9,
    m_neg: float = 0.1,
    lam: float = 0.5,
    reduction: str = "paper",
) -> torch.Tensor:
    """Margin loss on capsule lengths ``[B, K]``; ``targets`` are labels ``[B]`` or (multi-)hot ``[B, K]``.

    ``L_k = T_k max(0, m+ - |v_k|)^2 + lam (1 - T_k) max(0, |v_k| - m-)^2``.

    * ``reduction="paper"``: sum over classes, mean over the batch (Sabour et al. 2017, Eq. 4; also
      Efficient-CapsNet).
    * ``reduction="official"``: the official TensorFlow code: ``0.5*pos + 0.25*neg`` averaged over batch
      **and** classes, i.e. ``paper / (2K)``, which makes the reconstruction term relatively ``2K``
      (= 20 for MNIST) times heavier.
    * ``reduction="none"``: per-sample losses ``[B]`` (summed over classes).
    """
    check_tensor(lengths, "lengths", "[B, K]", [None, None])
    K = lengths.shape[1]
    t = one_hot(targets, K, lengths.dtype)
    lf = lengths.float()
    pos = t * F.relu(m_pos - lf).pow(2)
    neg = (1 - t) * F.relu(lf - m_neg).pow(2)
    if reduction == "official":
        return (0.5 * pos + 0.25 * neg).mean()
    per_sample = (pos + lam * neg).sum(dim=1)
    if reduction == "paper":
        return per_sample.mean()
    if reduction == "none":
        return per_sample
    raise ValueError(f"unknown reduction {reduction!r}; expected 'paper', 'official' or 'none'")


def reconstruction_loss(recon: torch.Tensor, target: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """Reconstruction error between ``recon`` and ``target`` (same number of elements per sample).

    * ``"sum"``: sum of squared errors per image, mean over the batch (Sabour et al.; weight it by 0.0005).
    * ``"mean"``: mean squared error over pixels and batch (Efficient-CapsNet; weight 0.392 = 0.0005 * 784).
    """
    B = recon.shape[0]
    r = recon.reshape(B, -1).float()
    t = target.reshape(B, -1).float()
    if r.shape != t.shape:
        raise ValueError(f"recon {tuple(recon.shape)} and target {tuple(target.shape)} differ in size")
    se = (r - t).pow(2)
    if reduction == "sum":
        return se.sum(dim=1).mean()
    if reduction == "mean":
        return se.mean()
    raise ValueError(f"unknown reduction {reduction!r}; expected 'sum' or 'mean'")


def spread_margin(step: int, total_steps: int, m_min: float = 0.2, m_max: float = 0.9) -> float:
    """Hinton et al. (2018) margin schedule: ``m`` grows linearly from ``m_min`` to ``m_max`` over training."""
    if total_steps <= 0:
        return m_max
    frac = min(max(step / total_steps, 0.0), 1.0)
    return m_min + (m_max - m_min) * frac


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float = 0.2) -> torch.Tensor:
    """Spread loss ``L = sum_{i != t} max(0, m - (a_t - a_i))^2``, mean over the batch.

    ``activations`` ``[B, K]`` (class-capsule activations), ``targets`` ``[B]`` integer labels.
    """
    check_tensor(activations, "activations", "[B, K]", [None, None])
    a = activations.float()
    a_t = a.gather(1, targets.long().view(-1, 1))  # [B, 1]
    loss = F.relu(margin - (a_t - a)).pow(2)  # [B, K]
    loss = loss.scatter(1, targets.long().view(-1, 1), 0.0)  # drop i == t
    return loss.sum(dim=1).mean()


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy with soft (e.g. mixup) targets: ``-sum_k t_k log softmax(logits)_k``, mean over the batch.

    ``logits`` ``[B, K]``; ``targets`` ``[B, K]`` probabilities or ``[B]`` labels.
    """
    t = one_hot(targets, logits.shape[-1], torch.float32)
    return -(t * F.log_softmax(logits.float(), dim=-1)).sum(dim=-1).mean()


class MarginLoss(nn.Module):
    """Module form of :func:`margin_loss`."""

    def __init__(self, m_pos: float = 0.9, m_neg: float = 0.1, lam: float = 0.5, reduction: str = "paper") -> None:
        super().__init__()
        self.m_pos, self.m_neg, self.lam, self.reduction = m_pos, m_neg, lam, reduction

    def forward(self, lengths: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return margin_loss(lengths, targets, self.m_pos, self.m_neg, self.lam, self.reduction)


class ReconstructionLoss(nn.Module):
    """Module form of :func:`reconstruction_loss`."""

    def __init__(self, reduction: str = "sum") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, recon: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return reconstruction_loss(recon, target, self.reduction)


class SpreadLoss(nn.Module):
    """Module form of :func:`spread_loss`; call :meth:`set_margin` (or pass ``margin``) as training goes on."""

    def __init__(self, margin: float = 0.2) -> None:
        super().__init__()
        self.margin = margin

    def set_margin(self, step: int, total_steps: int, m_min: float = 0.2, m_max: float = 0.9) -> float:
        self.margin = spread_margin(step, total_steps, m_min, m_max)
        return self.margin

    def forward(self, activations: torch.Tensor, targets: torch.Tensor, margin: float | None = None) -> torch.Tensor:
        return spread_loss(activations, targets, self.margin if margin is None else margin)


class SoftTargetCrossEntropy(nn.Module):
    """Module form of :func:`soft_target_cross_entropy`."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return soft_target_cross_entropy(logits, targets)


# ------------------------------------------------------------------------------------------- objectives
@dataclass
class StepOutput:
    """What an objective returns for one batch: the loss to minimise, its named parts (detached 0-d tensors or
    floats) and the number of correct predictions out of ``n`` (a 0-d tensor or a number). Tensors stay on the
    device: the :class:`~capsule_lib.train.trainer.Trainer` sums them there and reads them once per epoch, so a
    GPU step does not wait for the device to report them."""

    loss: torch.Tensor
    parts: dict[str, torch.Tensor | float]
    correct: torch.Tensor | float
    n: int


class ClassifierObjective:
    """Cross-entropy on logits for plain classifiers ``model(x) -> [B, K]`` (e.g. the CNN baselines), or
    on ``out.scores`` for capsule models that return a :class:`~capsule_lib.types.CapsuleOutput`."""

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...], train: bool) -> StepOutput:
        x, y = batch[0], batch[1]
        out = model(x)
        logits = out if isinstance(out, torch.Tensor) else out.scores
        loss = nn.functional.cross_entropy(logits.float(), y)
        correct = (logits.argmax(1) == y).sum()
        return StepOutput(loss, {"ce": loss.detach()}, correct, y.shape[0])


def _require_lengths(out: Any, objective: str) -> None:
    """The margin loss is defined on capsule lengths in [0, 1); refuse logits or activations in one line."""
    if out.kind != "lengths":
        raise ValueError(
            f"{objective}: the margin loss needs capsule lengths, but the model's scores are "
            f"{out.kind}; train it with ClassifierObjective (cross-entropy) or its own loss"
        )


def reconstruction_target(out: Any, x: torch.Tensor) -> torch.Tensor:
    """What a model's reconstruction is compared with: the images ``x`` themselves, or, for a network behind an
    :class:`~capsule_lib.layers.ImageStem` that resizes them, the images as the stem resizes them (the model's
    ``out.extra["reconstruction_target"]``, ``[B, C, stem_side, stem_side]``: its decoder stays the paper's size).

    Parameters
    ----------
    out : CapsuleOutput
        The model's output on ``x``.
    x : torch.Tensor
        ``[B, C, H, W]`` the images the model read.

    Returns
    -------
    torch.Tensor
        ``[B, C, H', W']``, the shape of ``out.reconstruction``.
    """
    return out.extra.get("reconstruction_target", x)


class CapsuleObjective:
    """Margin loss + ``recon_weight`` x reconstruction loss for models returning a ``CapsuleOutput``.

    The decoder is masked by the true label in training and in evaluation (so the validation loss is the
    same quantity as the training loss); accuracy is the argmax of the capsule lengths.
    ``margin_reduction``: ``"paper"`` or ``"official"`` (see :func:`~capsule_lib.losses.margin_loss`);
    ``recon_reduction``: ``"sum"`` (Sabour, weight 0.0005) or ``"mean"`` (Efficient-CapsNet, weight 0.392).
    """

    @checked
    def __init__(
        self, recon_weight: float = 0.0005, margin_reduction: str = "paper", recon_reduction: str = "sum"
    ) -> None:
        self.recon_weight, self.margin_reduction, self.recon_reduction = recon_weight, margin_reduction, recon_reduction

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...], train: bool) -> StepOutput:
        x, y = batch[0], batch[1]
        use_decoder = self.recon_weight > 0
        out = model(x, y) if use_decoder else model(x)
        _require_lengths(out, type(self).__name__)
        margin = margin_loss(out.scores, y, reduction=self.margin_reduction)
        parts = {"margin": margin.detach()}
        loss = margin
        if use_decoder and out.reconstruction is not None:
            recon = reconstruction_loss(out.reconstruction, reconstruction_target(out, x), self.recon_reduction)
            loss = loss + self.recon_weight * recon
            parts["recon"] = recon.detach()
        correct = (out.scores.argmax(1) == y).sum()
        return StepOutput(loss, parts, correct, y.shape[0])


class SpreadObjective:
    """Spread loss (Hinton, Sabour & Frosst 2018) on the class capsules' activations (``out.kind ==
    "activations"``, e.g. :class:`~capsule_lib.models.EMCapsNet`); accuracy is the argmax activation.

    The margin grows linearly from ``m_min`` to ``m_max`` over the run, one value per epoch (epoch ``e`` of
    ``E``: ``m_min + (m_max - m_min) * e / (E - 1)``), so a resumed run uses exactly the margins of an
    uninterrupted one. The :class:`Trainer` calls :meth:`set_epoch` before every epoch; validation uses the
    margin of the epoch just trained.
    """

    def __init__(self, m_min: float = 0.2, m_max: float = 0.9) -> None:
        self.m_min, self.m_max = m_min, m_max
        self.margin = m_min

    def set_epoch(self, epoch: int, epochs: int) -> None:
        self.margin = spread_margin(epoch, max(epochs - 1, 0), self.m_min, self.m_max)

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...], train: bool) -> StepOutput:
        x, y = batch[0], batch[1]
        out = model(x)
        if out.kind != "activations":
            raise ValueError(f"SpreadObjective: the spread loss needs class activations, but the scores are {out.kind}")
        loss = spread_loss(out.scores, y, self.margin)
        correct = (out.scores.argmax(1) == y).sum()
        return StepOutput(loss, {"spread": loss.detach(), "margin": self.margin}, correct, y.shape[0])


class ScoreObjective:
    """Each kind of class score with the loss its paper trains it with: capsule ``"lengths"`` with the margin
    loss, ``"activations"`` with the spread loss (margin from ``m_min`` to ``m_max`` over the run, as in
    :class:`SpreadObjective`), ``"logits"`` with cross-entropy. For models whose score kind depends on their
    configuration (:class:`~capsule_lib.models.RoutingClassifier`); no reconstruction. Accuracy is the argmax."""

    @checked
    def __init__(self, m_min: float = 0.2, m_max: float = 0.9) -> None:
        self.spread = SpreadObjective(m_min, m_max)

    def set_epoch(self, epoch: int, epochs: int) -> None:
        self.spread.set_epoch(epoch, epochs)

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...], train: bool) -> StepOutput:
        x, y = batch[0], batch[1]
        out = model(x)
        scores = out.scores.float()
        if out.kind == "lengths":
            loss, part = margin_loss(scores, y), "margin"
        elif out.kind == "activations":
            loss, part = spread_loss(scores, y, self.spread.margin), "spread"
        else:
            loss, part = nn.functional.cross_entropy(scores, y), "ce"
        correct = (scores.argmax(1) == y).sum()
        return StepOutput(loss, {part: loss.detach()}, correct, y.shape[0])


class MultiDigitObjective:
    """Two-digit images (MultiMNIST): batches ``(x, labels [B, 2], source_a, source_b)``.

    Margin loss against the two-hot target, plus ``recon_weight`` x the reconstruction error of **each**
    digit decoded on its own from its capsule (the model must put per-digit decodes in
    ``out.extra["reconstructions"] [B, 2, C, H, W]``, e.g. ``EfficientCapsNet`` with ``decode_separately``;
    Efficient-CapsNet weights each 0.196 with ``recon_reduction="mean"``). ``correct`` counts images whose
    two labels are the two longest capsules (Sabour et al.'s strict metric).
    """

    def __init__(self, recon_weight: float = 0.196, recon_reduction: str = "mean") -> None:
        self.recon_weight, self.recon_reduction = recon_weight, recon_reduction

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...], train: bool) -> StepOutput:
        x, y2, src_a, src_b = batch[:4]
        out = model(x, y2)
        _require_lengths(out, type(self).__name__)
        target = torch.zeros_like(out.scores, dtype=torch.float32).scatter_(1, y2.long(), 1.0)
        margin = margin_loss(out.scores, target)
        parts = {"margin": margin.detach()}
        loss = margin
        recons = out.extra.get("reconstructions")
        if self.recon_weight > 0 and recons is not None:
            ra = reconstruction_loss(recons[:, 0], src_a, self.recon_reduction)
            rb = reconstruction_loss(recons[:, 1], src_b, self.recon_reduction)
            loss = loss + self.recon_weight * (ra + rb)
            parts["recon"] = (ra + rb).detach() / 2
        top2 = out.scores.topk(2, dim=1).indices
        both = (top2.sort(1).values == y2.long().sort(1).values).all(1)
        return StepOutput(loss, parts, both.sum(), x.shape[0])
