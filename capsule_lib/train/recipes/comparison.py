"""The routing comparison: one network, each routing algorithm, equal training time (MNIST and the viewpoint
protocol).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...losses import (
    ScoreObjective,
)
from ...models.routing_classifier import RoutingClassifierConfig
from .base import (
    ShiftDecayRecipe,
)
from .viewpoints import (
    ViewpointRecipe,
)

__all__ = ["RoutingCompareRecipe", "RoutingCompareNorbRecipe"]


@dataclass
class RoutingCompareRecipe(ShiftDecayRecipe):
    """The comparison chapter's controlled experiment: a :class:`~capsule_lib.models.RoutingClassifier` (shared
    stem and primary capsules, ``model.routing`` chooses the routing) on MNIST, with the same data, +-2 px
    shifts, Adam (lr 1e-3, x0.96 every 2000 steps, as CapsNet's recipe), batch 128 and validation-split selection
    for every routing; each routing's paper loss (:class:`~capsule_lib.losses.ScoreObjective`). The runs are
    made equal in **wall-clock training time** on one machine (``train(..., budget_minutes=)``); ``epochs`` is
    only the cap (and the spread loss's margin schedule). ``warmup_epochs`` (default 0, none: the shipped runs')
    ramps the learning rate linearly up from ``lr / n`` over the first ``n`` batches of that many epochs (a remedy
    ``benchmarks/learning_diagnostics.py`` tries)."""

    name: ClassVar[str] = "routing_compare_mnist"

    epochs: int = 30
    warmup_epochs: float = 0.0
    model: RoutingClassifierConfig = field(default_factory=RoutingClassifierConfig)

    model_kind: ClassVar[str] = "routing_classifier"

    def lr_factor(self, step: int) -> float:
        ramp = max(1.0, self.warmup_epochs * max(1, getattr(self, "_steps_per_epoch", 1)))
        return min(1.0, (step + 1) / ramp) * super().lr_factor(step) if self.warmup_epochs else super().lr_factor(step)

    def validate(self) -> None:
        super().validate()
        w = self.warmup_epochs
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 <= w <= self.epochs:
            raise ValueError(f"{self.name}: warmup_epochs must be a number from 0 to epochs ({self.epochs}), got {w!r}")

    def build_objective(self) -> Any:
        return ScoreObjective()


@dataclass
class RoutingCompareNorbRecipe(ViewpointRecipe):
    """The comparison's controlled experiment on the smallNORB viewpoint protocol (:class:`ViewpointRecipe`:
    familiar and novel test views, Hinton et al.'s crops and jitter, batch 32, Adam lr ``3e-3`` x ``0.85`` per
    epoch): the :class:`~capsule_lib.models.RoutingClassifier` of :class:`RoutingCompareRecipe` fed both stereo
    images (2 x 32 x 32, 784 primary capsules, 5 classes), each routing with its paper loss, the runs made equal
    in wall-clock training time (``budget_minutes``); ``epochs`` is the cap (and the schedules' length)."""

    name: ClassVar[str] = "routing_compare_norb"

    model: RoutingClassifierConfig = field(
        default_factory=lambda: RoutingClassifierConfig(in_channels=2, image_size=32, n_classes=5)
    )

    model_kind: ClassVar[str] = "routing_classifier"

    def build_objective(self) -> Any:
        return ScoreObjective()
