"""Losses of the capsule papers: margin (Sabour 2017 / Mazzia 2021), spread (Hinton 2018),
reconstruction, and soft-target cross-entropy (Heinsen 2019, used with mixup)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_tensor

__all__ = [
    "one_hot",
    "margin_loss",
    "reconstruction_loss",
    "spread_loss",
    "spread_margin",
    "soft_target_cross_entropy",
    "MarginLoss",
    "ReconstructionLoss",
    "SpreadLoss",
    "SoftTargetCrossEntropy",
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
