"""The CIFAR-10 recipes: inverted dot-product attention routing (Tsai et al. 2020), the paper's recipe, its
CPU-sized variant and that variant's backbone with a linear head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ...data import DataSource
from ...data.transforms import random_crop_flip, random_shift
from ...losses import (
    ClassifierObjective,
)
from ...models.inverted import CIFAR10_MEAN, CIFAR10_STD, CapsModelConfig
from .base import Recipe

__all__ = ["TsaiCifarRecipe", "TsaiCifarCPURecipe", "BackboneCifarCPURecipe"]


def _tsai_paper_config() -> CapsModelConfig:
    return CapsModelConfig.cifar10("resnet", input_mean=CIFAR10_MEAN, input_std=CIFAR10_STD)


@dataclass
class TsaiCifarRecipe(Recipe):
    """Tsai et al. (2020) CIFAR-10 recipe, the official ``main_capsule.py`` settings: the resnet-backbone
    :class:`~capsule_lib.models.CapsModel` (1,828,817 parameters, T = 2, concurrent schedule); SGD lr 0.1,
    momentum 0.9, weight decay 5e-4 (on every parameter), x0.1 at epochs 150 and 250, 350 epochs, batch 128,
    cross-entropy on the shared ``final_fc`` logits; training images ``RandomCrop(32, padding=4)`` +
    ``HorizontalFlip`` (:func:`~capsule_lib.data.transforms.random_crop_flip`), the official normalisation
    inside the model. Unlike the official code (which keeps the checkpoint of the best **test** accuracy),
    the checkpoint is chosen on a validation split of 5,000 training images; the test split is read once."""

    name: ClassVar[str] = "tsai_cifar10"

    dataset: str = "cifar10"
    epochs: int = 350
    batch_size: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[int, ...] = (150, 250)  # MultiStepLR, gamma 0.1 (per epoch)
    gamma: float = 0.1
    crop_padding: int = 4
    flip: bool = True
    model: CapsModelConfig = field(default_factory=_tsai_paper_config)

    model_kind: ClassVar[str] = "caps_model"

    def build_objective(self) -> Any:
        return ClassifierObjective()

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=self.momentum, weight_decay=self.weight_decay)

    def lr_factor(self, step: int) -> float:
        return self.gamma ** sum(step >= m for m in self.milestones)

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        if self.flip:
            return (random_crop_flip(x, self.crop_padding, g), *rest)
        return (random_shift(x, self.crop_padding, g), *rest)

    def has_augmentation(self) -> bool:
        return bool(self.crop_padding) or self.flip

    def evaluation_sets(self, data_root: DataSource | str | None = None) -> dict[str, Any]:
        """``val`` and ``test``, plus ``test_exact`` when the test split carries an ``exact`` mask (a copy of
        CIFAR-10 some of whose test images were recovered from a lossy source: only those marked exact are the
        original images, so that accuracy is the one to quote)."""
        sets = super().evaluation_sets(data_root)
        exact = sets["test"].extra.get("exact")
        if exact is not None and not bool(exact.all()):
            sets["test_exact"] = sets["test"].subset(torch.nonzero(exact).squeeze(1))
        return sets


def _tsai_cpu_config() -> CapsModelConfig:
    return CapsModelConfig.cifar10_cpu()


@dataclass
class TsaiCifarCPURecipe(TsaiCifarRecipe):
    """The chapter's CPU budget for Tsai et al.'s model: the CPU-sized variant
    (:meth:`~capsule_lib.models.CapsModelConfig.cifar10_cpu`) with the paper's data pipeline, loss, optimiser
    and weight decay, but a one-cycle schedule that fits ``epochs`` = 15 (per batch: linear warm-up from
    ``lr/10`` to ``lr`` over the first ``warmup`` fraction of the steps, then linear decay to 0). Validation
    split selection as in :class:`TsaiCifarRecipe`."""

    name: ClassVar[str] = "tsai_cifar10_cpu"
    scheduler_step: ClassVar[str] = "batch"

    epochs: int = 15
    warmup: float = 0.15
    model: CapsModelConfig = field(default_factory=_tsai_cpu_config)

    def lr_factor(self, step: int) -> float:
        total = max(1, self.epochs * getattr(self, "_steps_per_epoch", 1))
        warm = max(1, int(self.warmup * total))
        if step < warm:
            return 0.1 + 0.9 * step / warm
        return max(0.0, (total - step) / max(1, total - warm))


@dataclass
class BackboneCifarCPURecipe(TsaiCifarCPURecipe):
    """The baseline of :class:`TsaiCifarCPURecipe`: the same backbone (same config) with global average
    pooling and a linear head (:class:`~capsule_lib.models.BackboneClassifier`) instead of the capsule layers;
    same data, augmentation, optimiser, schedule and epochs."""

    name: ClassVar[str] = "baseline_backbone_cifar10_cpu"

    model_kind: ClassVar[str] = "backbone_classifier"
