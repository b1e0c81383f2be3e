"""Did this run learn? The check every training run makes of itself, after its first epoch and at its end.

:mod:`capsule_lib.learning` holds the book's rule for comparisons (a run against the best run on the same data and
budget); a single run, such as a reader's on their own images, has nothing to compare with, so it is held to an
absolute line instead: its validation accuracy must be **clearly above chance** and its class capsules must be
**neither all saturated nor all collapsed**.

* Chance is the accuracy of always naming the validation split's most frequent class (``1 / K`` for balanced
  classes). "Clearly above" is :data:`Z_ABOVE_CHANCE` standard errors of a guesser's accuracy on that many
  validation images above it (and at least :data:`MIN_MARGIN`): 4 balanced classes and 100 validation images need
  38 %, 10 classes and 1,000 images 12.8 %. A validation split too small for that line to be below 100 % cannot
  tell, and the check says so (``learned`` is then ``None``).
* Saturated: at least :data:`SHARE` of the class capsules' scores (lengths or activations) above 0.99, the squash
  of votes that are far too long. Collapsed: at least that share below 0.01. A network scored by logits has no
  capsule lengths; for every network, one class named for (almost) every image is a symptom too.

The check after the first epoch stops a **dead** run (at chance *and* its class capsules saturated or collapsed: it
would train for hours at chance); a run at chance with healthy capsules, or one that still names one class for every
image (as networks do after their first few steps), trains on and is judged at its end. Each verdict is one line
(the symptom, its likely cause, what to try) and a record in ``history.meta["learning_check"]`` (with
``history.meta["learned"]``), which
:func:`~capsule_lib.pretrained.load_trained` reads to warn about a run that did not learn.
``python -m capsule_lib.train`` exits with :data:`DID_NOT_LEARN_EXIT` for such a run (it keeps its checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = [
    "Z_ABOVE_CHANCE",
    "MIN_MARGIN",
    "SHARE",
    "DID_NOT_LEARN_EXIT",
    "LearningVerdict",
    "chance_accuracy",
    "above_chance_line",
    "applies",
    "check_learning",
    "LearningCheck",
]

#: standard errors of a guesser's accuracy above chance that "clearly above chance" asks for
Z_ABOVE_CHANCE = 3.0
#: the least margin above chance, in accuracy (a large validation split still needs this much)
MIN_MARGIN = 0.02
#: the share of class scores above 0.99 (saturated) or below 0.01 (collapsed), or of images given one class, that
#: makes a symptom
SHARE = 0.95
#: ``python -m capsule_lib.train``'s exit status for a run that finished, or was stopped, without learning
DID_NOT_LEARN_EXIT = 3


@dataclass
class LearningVerdict:
    """What :func:`check_learning` found.

    Attributes
    ----------
    learned : bool or None
        Clearly above chance with healthy class capsules; ``None`` when the validation split is too small to tell.
    dead : bool
        At chance with its class capsules saturated or collapsed (a run stops on this after its first epoch).
    epoch : float
        The epoch whose weights were checked.
    val_acc, chance, line : float
        Validation accuracy, chance (the most frequent validation class's share) and the accuracy a run must reach.
    val_images : int
        The validation images behind ``val_acc``.
    symptoms : list of str
        ``"at chance"``, ``"saturated"``, ``"collapsed"``, ``"one class"``: what was measured.
    measured : dict
        The capsules' health on the validation images: ``saturated`` and ``collapsed`` shares (``None`` for
        logits), ``top_class_share`` (the share of images given the most often predicted class).
    reason : str
        One sentence: the symptom, its likely cause and what to try (empty when it learned).
    """

    learned: bool | None
    dead: bool
    epoch: float
    val_acc: float
    chance: float
    line: float
    val_images: int
    symptoms: list[str] = field(default_factory=list)
    measured: dict[str, Any] = field(default_factory=dict)
    reason: str = ""

    def record(self) -> dict[str, Any]:
        """Plain values for ``history.meta["learning_check"]``."""
        return asdict(self)

    def message(self, where: str) -> str:
        """The one line a run prints about itself."""
        if self.learned:
            return (
                f"{where}: learned (validation {self.val_acc:.1%} at epoch {self.epoch:g}, clearly above chance "
                f"{self.chance:.1%}: the line is {self.line:.1%})"
            )
        if self.learned is None:
            return f"{where}: cannot tell whether it learned: {self.reason}"
        return f"{where}: did not learn: {self.reason}"


def chance_accuracy(labels: torch.Tensor) -> float:
    """The accuracy of always naming the most frequent class of ``labels`` (``[N]`` class indices)."""
    if labels.numel() == 0:
        raise ValueError("chance_accuracy needs at least one label")
    return torch.bincount(labels.long().flatten()).max().item() / labels.numel()


def above_chance_line(chance: float, n: int) -> float:
    """The validation accuracy that is clearly above ``chance`` on ``n`` images: :data:`Z_ABOVE_CHANCE` standard
    errors of a guesser's accuracy above it, at least :data:`MIN_MARGIN`."""
    if n < 1 or not 0.0 <= chance <= 1.0:
        raise ValueError(f"above_chance_line needs n >= 1 and chance in [0, 1], got n={n!r}, chance={chance!r}")
    return chance + max(MIN_MARGIN, Z_ABOVE_CHANCE * math.sqrt(chance * (1 - chance) / n))


def applies(loader: Any) -> bool:
    """Whether the check can read ``loader``: a loader of in-memory tensors whose labels are one class per item
    (not a dict of several test sets, not MultiMNIST's pairs of labels)."""
    tensors = getattr(loader, "tensors", None)
    return tensors is not None and len(tensors) > 1 and tensors[1].dim() == 1 and len(tensors[1]) > 0


@torch.no_grad()
def _health(model: nn.Module, loader: Any, device: torch.device) -> dict[str, Any]:
    """The class scores' saturation and collapse and the most often predicted class's share over the validation
    split (its batches, as the trainer evaluates them: images in memory or read from their files)."""
    was = model.training
    model.eval()
    try:
        outs = [model(batch[0].to(device)) for batch in loader]
    finally:
        model.train(was)
    scores = torch.cat([getattr(o, "scores", o).detach().float().cpu() for o in outs])  # a CNN's logits: a tensor
    kind = getattr(outs[0], "kind", "logits")
    top = torch.bincount(scores.argmax(1), minlength=scores.shape[1]).max().item() / len(scores)
    measured: dict[str, Any] = {"kind": kind, "top_class_share": top, "saturated": None, "collapsed": None}
    if kind in ("lengths", "activations"):
        measured["saturated"] = (scores > 0.99).double().mean().item()
        measured["collapsed"] = (scores < 0.01).double().mean().item()
    return measured


def _epochs(v: dict[str, Any]) -> str:
    return f"{v['epoch']:g} epoch" + ("" if v["epoch"] == 1 else "s")


def _reason(symptoms: list[str], v: dict[str, Any], lr: float | None) -> str:
    """The symptom, its likely cause and what to try, in one sentence."""
    acc = f"validation {v['val_acc']:.1%} against chance {v['chance']:.1%} (the line is {v['line']:.1%})"
    lower = f" (--set lr={lr / 10:g})" if lr else ""
    if "saturated" in symptoms:
        return (
            f"{acc}; {v['measured']['saturated']:.0%} of the class capsules are saturated (length > 0.99), the squash "
            f"of votes far too long (a layer fed by very many capsules, or a learning rate too high): keep the "
            f"network's own input size (its stem, or --image-size), or lower the learning rate{lower}"
        )
    if "collapsed" in symptoms:
        return (
            f"{acc}; {v['measured']['collapsed']:.0%} of the class capsules have collapsed (length < 0.01): the votes "
            f"vanished (dead units after too large a step): lower the learning rate{lower}"
        )
    if "one class" in symptoms:
        return (
            f"{acc}; it names one class for {v['measured']['top_class_share']:.0%} of the images after {_epochs(v)} "
            f"(its scores do not follow the pictures yet): train longer (--set epochs=..., --budget-minutes); "
            f"if it stays there, lower the learning rate{lower}"
        )
    return (
        f"{acc} after {_epochs(v)}: too few epochs or images for these classes, or labels that do not follow "
        f"the pictures (check the class folders): train longer (--set epochs=...) or bring more images per class"
    )


def check_learning(
    model: nn.Module,
    val_loader: Any,
    val_acc: float,
    epoch: float,
    *,
    lr: float | None = None,
) -> LearningVerdict:
    """Whether a network with validation accuracy ``val_acc`` learned (see the module docstring).

    Parameters
    ----------
    model : nn.Module
        The weights to check (their scores' health is measured on the validation split).
    val_loader : object
        The validation loader (its images and labels: chance and the probe).
    val_acc : float
        The validation accuracy of these weights (the trainer's evaluation over the whole split).
    epoch : float
        Their epoch (for the record and the message).
    lr : float, optional
        The run's learning rate (the advice names a lower one).

    Returns
    -------
    LearningVerdict
        The verdict; ``learned`` is ``None`` when the validation split cannot tell.
    """
    if not applies(val_loader):
        raise ValueError("check_learning needs a validation loader of in-memory images and one class label each")
    y = val_loader.tensors[1].cpu()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    chance, n = chance_accuracy(y), len(y)
    line = above_chance_line(chance, n)
    measured = _health(model, val_loader, device)
    above = val_acc >= line
    symptoms = [] if above else ["at chance"]
    for name in ("saturated", "collapsed"):
        if measured[name] is not None and measured[name] >= SHARE:
            symptoms.append(name)
    if measured["top_class_share"] >= SHARE and not above:
        symptoms.append("one class")
    v = {"val_acc": val_acc, "chance": chance, "line": line, "epoch": epoch, "measured": measured}
    learned: bool | None = above and not ({"saturated", "collapsed"} & set(symptoms))
    reason = "" if learned else _reason(symptoms, v, lr)
    if line >= 1.0 and not learned:  # too few validation images to tell a learned network from a guesser
        learned = None
        reason = (
            f"{n} validation images cannot tell a network from chance {chance:.1%} (it would need "
            f"{line:.1%}); hold out more images (--val-fraction) or bring more"
        )
    dead = not above and bool({"saturated", "collapsed"} & set(symptoms))  # one class alone: maybe just early
    return LearningVerdict(learned, dead, epoch, val_acc, chance, line, n, symptoms, measured, reason)


class LearningCheck:
    """A training callback (``cb(trainer, record)``) that checks the run after its first full epoch
    (:func:`check_learning`) and stops it there when the network is dead: the verdict goes to
    ``trainer.history.meta["learning_check"]`` and, for a stopped run, ``meta["learned"] = False``; the run's final
    verdict is :meth:`finish`'s, on the weights chosen on validation."""

    def __init__(self, val_loader: Any, lr: float | None = None) -> None:
        self.val_loader, self.lr = val_loader, lr
        self.stopped: LearningVerdict | None = None

    def _model(self, trainer: Any) -> nn.Module:
        return trainer.ema.module if getattr(trainer, "ema", None) is not None else trainer.model

    def __call__(self, trainer: Any, record: dict[str, Any]) -> None:
        if record.get("partial") or record.get("epoch") != 1 or record.get("val_acc") is None:
            return
        verdict = check_learning(self._model(trainer), self.val_loader, record["val_acc"], 1, lr=self.lr)
        trainer.history.meta["learning_check"] = verdict.record()
        if verdict.dead and not trainer.dist.distributed and trainer.epochs > trainer.epoch:
            self.stopped = verdict
            trainer.history.meta["learned"] = False
            trainer.history.meta["learning_check"]["stopped_at_epoch"] = trainer.epoch
            trainer.epochs = trainer.epoch  # the loop ends after this epoch; last.pt and best.pt are kept
            where = trainer.out_dir or "run"
            trainer._say(f"{verdict.message(str(where))}; stopped after epoch 1 (the network is dead)")

    def finish(self, trainer: Any) -> LearningVerdict | None:
        """The run's verdict on the weights it selected (call after :meth:`Trainer.finish`): recorded in
        ``history.meta`` (and ``history.json``), said in one line unless the run learned quietly. ``None`` when no
        epoch was validated."""
        best = trainer.history.best("val_acc")
        if best is None:
            return None
        if self.stopped is not None:
            verdict = self.stopped
        else:
            verdict = check_learning(self._model(trainer), self.val_loader, best["val_acc"], best["epoch"], lr=self.lr)
            where = str(trainer.out_dir or "run")
            if not verdict.learned:
                trainer._say(verdict.message(where))
        meta = trainer.history.meta
        meta["learned"] = verdict.learned
        if self.stopped is None:  # a stopped run keeps its first epoch's record, with the epoch it stopped at
            meta["learning_check"] = verdict.record()
        if trainer._writes:
            trainer.history.save(trainer.out_dir / "history.json")
        return verdict
