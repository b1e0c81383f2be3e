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
attacked the same way; ``loss_fn`` takes a model's own loss instead. The model runs in eval mode with gradients
through its routing, at the routing iterations it is configured with (a model's ``iterations`` at attack time is
the number it runs; the attack follows its gradients through all of them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["attack_loss", "fgsm", "bim", "robust_accuracy"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def attack_loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The common attack loss: cross-entropy of the class scores ``[B, K]`` read as logits, per image ``[B]``."""
    return F.cross_entropy(scores.float(), labels, reduction="none")


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


def _gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-image loss ``[B]`` and its gradient with respect to the images ``[B, C, H, W]``."""
    x = x.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = loss_fn(_scores(model, x), y)
        (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), grad


def fgsm(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    eps: float,
    *,
    targeted: bool = False,
    loss_fn: LossFn = attack_loss,
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

    Returns
    -------
    torch.Tensor
        Adversarial images ``[B, C, H, W]``, within ``eps`` of ``x`` and in [0, 1].
    """
    _check(model, x, y, eps)
    _, grad = _gradient(model, x, y, loss_fn)
    step = eps * grad.sign() * (-1.0 if targeted else 1.0)
    return (x + step).clamp(0, 1).detach()


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
    loss_fn: LossFn = attack_loss,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Basic iterative method (BIM; PGD with ``random_start`` and ``restarts``): ``steps`` signed-gradient steps of
    size ``alpha``, each projected back into the ``eps`` ball around ``x`` and into [0, 1].

    Parameters
    ----------
    model, x, y, targeted, loss_fn
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
    best, best_loss, best_fooled = x.clone(), torch.full_like(y, float("-inf"), dtype=torch.float), None
    for _ in range(restarts):
        x_adv = x.clone()
        if random_start:
            noise = torch.rand(x.shape, generator=generator, device="cpu").to(x.device, x.dtype)
            x_adv = torch.max(torch.min(x + eps * (2 * noise - 1), hi), lo)
        for _ in range(steps):
            _, grad = _gradient(model, x_adv, y, loss_fn)
            x_adv = torch.max(torch.min(x_adv + sign * alpha * grad.sign(), hi), lo).detach()
        with torch.no_grad():
            scores = _scores(model, x_adv)
            loss = sign * loss_fn(scores, y)  # higher is better for the attack
            hit = scores.argmax(1) == y
            fooled = hit if targeted else ~hit
        if best_fooled is None:
            best_fooled = torch.zeros_like(fooled)
        # an image keeps a fooling restart once it has one; otherwise the restart with the best loss
        take = (fooled & ~best_fooled) | (~best_fooled & ~fooled & (loss > best_loss))
        best[take], best_loss[take] = x_adv[take], loss[take]
        best_fooled |= fooled
    return best.detach()


def robust_accuracy(
    model: nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    eps: Sequence[float],
    attack: str = "fgsm",
    *,
    batch_size: int = 100,
    **kwargs,
) -> dict[float, float]:
    """Accuracy on adversarial copies of ``images`` (``uint8`` or float in [0, 1], ``[N, C, H, W]``), one attack
    per ``eps`` (``attack``: ``"fgsm"`` or ``"bim"``, with ``kwargs`` for it), on the model's device, in batches.

    Returns
    -------
    dict
        ``{eps: accuracy}``; ``eps = 0`` is the clean accuracy.
    """
    if attack not in ("fgsm", "bim"):
        raise ValueError(f"attack must be 'fgsm' or 'bim', got {attack!r}")
    fn = fgsm if attack == "fgsm" else bim
    device = next(model.parameters()).device
    x_all = images.float() / 255 if images.dtype == torch.uint8 else images.float()
    out: dict[float, float] = {}
    for e in eps:
        correct = 0
        for i in range(0, len(x_all), batch_size):
            x, y = x_all[i : i + batch_size].to(device), labels[i : i + batch_size].to(device)
            x_adv = x if e == 0 else fn(model, x, y, e, **kwargs)
            with torch.no_grad():
                correct += int((_scores(model, x_adv).argmax(1) == y).sum())
        out[float(e)] = correct / len(x_all)
    return out
