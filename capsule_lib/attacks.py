"""White-box adversarial attacks under an L-infinity budget: FGSM and BIM/PGD, untargeted and targeted.

The reference forms, each a few lines (Goodfellow et al. 2015; Kurakin et al. 2017; Madry et al. 2018)::

    FGSM:  x' = clip_[0,1](x + eps * sign(grad_x L(f(x), y)))                    (one step)
    BIM:   x_0 = x (PGD: x + U(-eps, eps)),  x_{t+1} = clip_{x, eps}(x_t + alpha * sign(grad_x L(f(x_t), y)))

``clip_{x, eps}`` projects back into the L-infinity ball of radius ``eps`` around the clean image and into the
valid pixel range [0, 1]. A *targeted* attack descends the loss of a chosen class instead of ascending the true
class's (the sign of the step flips). With restarts (PGD), each image keeps the restart that fooled the model, or
else the one with the highest loss.

The loss is a **common** one for every model, stated here: cross-entropy on the model's class scores read as
logits (``CapsuleOutput.scores``: logits, capsule lengths or activations; :func:`attack_loss`), so every network is
attacked the same way; ``loss_fn`` takes a model's own loss instead, and ``objective`` any function of the whole
output and the images (e.g. :func:`reconstruction_aware_objective`, an attack that also keeps the decoder's
reconstruction close to the input). The model runs in eval mode with gradients
through its routing, at the routing iterations it is configured with (a model's ``iterations`` at attack time is
the number it runs; the attack follows its gradients through all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .losses import reconstruction_target

__all__ = [
    "attack_loss",
    "reconstruction_distance",
    "reconstruction_aware_objective",
    "fgsm",
    "fgsm_sweep",
    "bim",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: ``(model output, images [B, C, H, W], labels [B]) -> per-image loss [B]``
Objective = Callable[[object, torch.Tensor, torch.Tensor], torch.Tensor]


def attack_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The common attack loss: cross-entropy of the class scores ``[B, K]`` read as logits, per image ``[B]``."""
    return F.cross_entropy(scores.float(), labels, reduction="none")


def reconstruction_distance(x: torch.Tensor, reconstruction: torch.Tensor) -> torch.Tensor:
    """The L2 distance ``[B]`` between images ``[B, C, H, W]`` and their reconstructions (DARCCC's detection
    statistic: the reconstruction from the winning class capsule, Frosst et al. 2018)."""
    return (x - reconstruction).flatten(1).norm(dim=1)


def reconstruction_aware_objective(weight: float, loss_fn: LossFn = attack_loss) -> Objective:
    """An attack objective that also pulls the reconstruction towards the input: ``loss_fn(scores, y) - weight *
    ||x - reconstruction||``, for models with a decoder (the reconstruction-aware attack DARCCC warns about).
    Ascended by an untargeted attack: it changes the class while keeping the distance a detector reads small."""

    def objective(out: object, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        recon = getattr(out, "reconstruction", None)
        if recon is None:
            raise ValueError("reconstruction_aware_objective needs a model with a decoder (output.reconstruction)")
        return loss_fn(out.scores, y) - weight * reconstruction_distance(reconstruction_target(out, x), recon)

    return objective


def _scores(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return out.scores if hasattr(out, "scores") else out


def _check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float) -> None:
    if model.training:
        raise ValueError("attacks run on a model in eval mode (dropout, batch statistics); call model.eval() first")
    if not 0 <= float(eps) <= 1:
        raise ValueError(f"eps is an L-infinity budget on [0, 1] pixels and must lie in [0, 1], got {eps!r}")
    if x.dim() != 4 or y.shape != x.shape[:1]:
        raise ValueError(f"expected images [B, C, H, W] and labels [B], got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.dtype == torch.uint8 or float(x.min()) < 0 or float(x.max()) > 1:
        raise ValueError("attacks take float images in [0, 1] (uint8 images: x.float() / 255)")


def _gradient(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, objective: Objective | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-image loss ``[B]``, its gradient with respect to the images ``[B, C, H, W]`` and the class scores
    ``[B, K]`` at ``x`` (the forward pass the gradient needed)."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        out = model(x)
        scores = out.scores if hasattr(out, "scores") else out
        loss = loss_fn(scores, y) if objective is None else objective(out, x, y)
        (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), grad, scores.detach()


def fgsm(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    targeted: bool = False,
    loss_fn: LossFn = attack_loss,
    objective: Objective | None = None,
) -> torch.Tensor:
    """Fast gradient sign method: one step of size ``eps`` along the sign of the loss gradient.

    Parameters
    ----------
    model
        A classifier in eval mode whose output has ``.scores [B, K]`` (or is the scores).
    x
        Clean images ``[B, C, H, W]`` in [0, 1].
    y
        The true labels ``[B]`` (untargeted) or the target classes ``[B]`` (``targeted=True``).
    eps
        The L-infinity budget, in pixel units of [0, 1].
    targeted
        Step down the loss of ``y`` (towards the target) instead of up the loss of the true class.
    loss_fn
        ``(scores, labels) -> per-image loss [B]``; default :func:`attack_loss`.
    objective
        ``(output, images, labels) -> per-image loss [B]``; replaces ``loss_fn`` when given.

    Returns
    -------
    torch.Tensor
        Adversarial images ``[B, C, H, W]``, within ``eps`` of ``x`` and in [0, 1].
    """
    _check(model, x, y, eps)
    _, grad, _ = _gradient(model, x, y, loss_fn, objective)
    step = eps * grad.sign() * (-1.0 if targeted else 1.0)
    return (x + step).clamp(0, 1).detach()


def fgsm_sweep(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: Sequence[float],
    *,
    targeted: bool = False,
    loss_fn: LossFn = attack_loss,
    objective: Objective | None = None,
) -> torch.Tensor:
    """:func:`fgsm` at every budget of ``eps`` from **one** gradient (FGSM's direction does not depend on the
    budget): ``[E, B, C, H, W]``, equal to ``torch.stack([fgsm(model, x, y, e) for e in eps])``."""
    for e in eps:
        _check(model, x, y, e)
    _, grad, _ = _gradient(model, x, y, loss_fn, objective)
    direction = grad.sign() * (-1.0 if targeted else 1.0)
    return torch.stack([(x + float(e) * direction).clamp(0, 1) for e in eps]).detach()


def bim(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    steps: int = 10,
    alpha: float | None = None,
    random_start: bool = False,
    restarts: int = 1,
    targeted: bool = False,
    early_stop: bool = False,
    loss_fn: LossFn = attack_loss,
    objective: Objective | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Basic iterative method (BIM; PGD with ``random_start`` and ``restarts``): ``steps`` signed-gradient steps of
    size ``alpha``, each projected back into the ``eps`` ball around ``x`` and into [0, 1].

    Parameters
    ----------
    model, x, y, targeted, loss_fn, objective
        As in :func:`fgsm`.
    eps
        The L-infinity budget.
    steps
        Iterations per restart (>= 1).
    alpha
        Step size; default ``eps / steps`` (Kurakin et al.'s BIM), ``2.5 * eps / steps`` with a random start
        (Madry et al.'s PGD).
    random_start
        Start each restart from a uniform point of the ``eps`` ball instead of ``x``.
    restarts
        Independent runs; each image keeps the first one that fools the model (untargeted: another class wins;
        targeted: the target wins), else the one with the highest (untargeted) or lowest (targeted) loss.
    early_stop
        Keep an image's first iterate that fools the model and stop stepping it (an adversarial example found
        along the way counts, and the remaining steps cost nothing for it). Off: every image takes every step.
    generator
        For the random starts (reproducible attacks).

    Returns
    -------
    torch.Tensor
        Adversarial images ``[B, C, H, W]``, within ``eps`` of ``x`` and in [0, 1].
    """
    _check(model, x, y, eps)
    if not isinstance(steps, int) or steps < 1 or not isinstance(restarts, int) or restarts < 1:
        raise ValueError(f"steps and restarts must be integers >= 1, got steps={steps!r}, restarts={restarts!r}")
    if alpha is None:
        alpha = (2.5 if random_start else 1.0) * eps / steps
    sign = -1.0 if targeted else 1.0
    lo, hi = (x - eps).clamp(min=0), (x + eps).clamp(max=1)  # the projection: the eps ball within [0, 1]

    def fools(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        hit = scores.argmax(1) == labels
        return hit if targeted else ~hit

    best, best_loss = x.clone(), torch.full_like(y, float("-inf"), dtype=torch.float)
    best_fooled = torch.zeros_like(y, dtype=torch.bool)
    for _ in range(restarts):
        run = (~best_fooled).nonzero().squeeze(1)  # an image a restart fooled keeps that restart
        if len(run) == 0:
            break
        x_adv = x.clone()
        if random_start:
            noise = torch.rand(x.shape, generator=generator, device="cpu").to(x.device, x.dtype)
            x_adv = torch.max(torch.min(x + eps * (2 * noise - 1), hi), lo)
        i = run
        for _ in range(steps):
            if len(i) == 0:
                break
            _, grad, scores = _gradient(model, x_adv[i], y[i], loss_fn, objective)
            if early_stop:  # iterates that fool already: keep them as they are
                keep = ~fools(scores, y[i])
                i, grad = i[keep], grad[keep]
            x_adv[i] = torch.max(torch.min(x_adv[i] + sign * alpha * grad.sign(), hi[i]), lo[i]).detach()
        with torch.no_grad():
            out = model(x_adv[run])
            scores = out.scores if hasattr(out, "scores") else out
            loss = sign * (loss_fn(scores, y[run]) if objective is None else objective(out, x_adv[run], y[run]))
            fooled = fools(scores, y[run])
        # an image keeps a fooling restart once it has one; otherwise the restart with the best loss
        take = fooled | (loss > best_loss[run])
        best[run[take]], best_loss[run[take]] = x_adv[run[take]], loss[take].float()
        best_fooled[run] |= fooled
    return best.detach()
