"""The MNIST and MultiMNIST recipes: CapsNet (Sabour et al. 2017), its CNN baseline, Efficient-CapsNet
(Mazzia et al. 2021) and both papers' MultiMNIST runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from ...data import DataSource, get_dataset
from ...data.multimnist import MultiMNISTLoader
from ...data.transforms import efficient_mnist_augment
from ...losses import (
    CapsuleObjective,
    ClassifierObjective,
    MultiDigitObjective,
)
from ...models.baselines import BaselineCNNConfig
from ...models.capsnet import CapsNetConfig
from ...models.efficient import EfficientCapsNetConfig
from .base import (
    Loaders,
    Recipe,
    ShiftDecayRecipe,
    _epoch_decay,
    _shard,
)

__all__ = [
    "CapsNetRecipe",
    "BaselineCNNRecipe",
    "EfficientCapsNetRecipe",
    "MultiMNISTRecipe",
    "EfficientMultiMNISTRecipe",
    "CapsNetMultiMNISTRecipe",
]


@dataclass
class CapsNetRecipe(ShiftDecayRecipe):
    """Sabour et al. (2017) MNIST recipe. Defaults follow the paper/official code except where noted:
    Adam, lr 1e-3 decayed x0.96 every 2000 steps (continuously), +-2 px random shifts of the training images,
    margin loss + 0.0005 x summed squared reconstruction error."""

    name: ClassVar[str] = "capsnet"

    epochs: int = 15
    recon_weight: float = 0.0005  # x sum of squared pixel errors
    margin_reduction: str = "paper"
    model: CapsNetConfig = field(default_factory=CapsNetConfig)

    model_kind: ClassVar[str] = "capsnet"

    def build_objective(self) -> Any:
        return CapsuleObjective(self.recon_weight, self.margin_reduction)


@dataclass
class BaselineCNNRecipe(ShiftDecayRecipe):
    """The plain CNN baseline, trained with CapsNet's data pipeline and budget (same epochs, batch, +-2 px
    shift, Adam and schedule) and cross-entropy, for the robustness comparison."""

    name: ClassVar[str] = "baseline_cnn"
    keep_epochs: ClassVar[bool] = True

    epochs: int = 15
    model: BaselineCNNConfig = field(default_factory=BaselineCNNConfig)

    model_kind: ClassVar[str] = "baseline_cnn"

    def build_objective(self) -> Any:
        return ClassifierObjective()


def _efficient_describe(model: nn.Module) -> dict[str, Any]:
    return {"parameters": model.num_parameters(), "parameters_with_decoder": model.num_parameters(True)}


@dataclass
class EfficientCapsNetRecipe(Recipe):
    """Mazzia et al. (2021) Efficient-CapsNet MNIST recipe; defaults are the official ``config.json`` /
    ``models/model.py`` values.

    Adam (Keras defaults, so ``eps=1e-7``), lr 5e-4 times ``0.97^epoch`` with a floor of 5e-5 (Keras
    ``LearningRateScheduler``, per epoch), batch 16, 150 epochs; loss = margin (sum over classes, mean over
    the batch) + 0.392 x MSE (mean over pixels) of the label-masked reconstruction of the *augmented*
    image; training augmentation :func:`~capsule_lib.data.transforms.efficient_mnist_augment` (rotation,
    margin-aware shift, squish, 4x4 erase). Unlike the official code (which validates on the test set),
    the checkpoint is chosen on the validation split; the test split is evaluated once, for the record.
    """

    name: ClassVar[str] = "efficient"

    epochs: int = 150
    batch_size: int = 16
    lr: float = 5e-4
    lr_decay: float = 0.97  # lr * lr_decay^epoch ...
    lr_min: float = 5e-5  # ... floored here
    adam_eps: float = 1e-7  # Keras Adam default (PyTorch's is 1e-8)
    recon_weight: float = 0.392  # x MSE (mean over pixels) = 0.0005 x 784
    augment: bool = True  # official MNIST augmentation, training batches only
    squish_kernel: str = "lanczos3"  # official; "bilinear" is cheaper
    model: EfficientCapsNetConfig = field(default_factory=EfficientCapsNetConfig)

    model_kind: ClassVar[str] = "efficient_capsnet"

    def build_objective(self) -> Any:
        return CapsuleObjective(self.recon_weight, margin_reduction="paper", recon_reduction="mean")

    def lr_factor(self, step: int) -> float:
        return _epoch_decay(self, step)

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        return (efficient_mnist_augment(x, g, self.squish_kernel), *rest)

    def has_augmentation(self) -> bool:
        return self.augment

    def describe(self, model: nn.Module) -> dict[str, Any]:
        return _efficient_describe(model)


@dataclass
class MultiMNISTRecipe(Recipe):
    """What the MultiMNIST recipes share: pairs of digits of different classes from the splits of ``dataset``,
    ``variant`` ``"sabour"`` (36x36, shifts up to +-4 px) or ``"efficient"`` (+-6 px), regenerated every epoch
    for training (``pairs_per_epoch``; the official streams are endless), fixed for validation (from the
    validation split) and test (from the test split). Batches ``(merged, labels [B, 2], source_a, source_b)``
    for :class:`~capsule_lib.losses.MultiDigitObjective`: margin loss on the two-hot target plus
    ``recon_weight`` x the reconstruction error of each digit decoded alone. The history's accuracy is "both
    digits right" (Sabour et al.'s metric)."""

    images_refusal: ClassVar[str] = (
        "it trains on pairs of overlapping digits (two labels per image), not on a folder of labelled images; train "
        "on your images with capsnet or efficient"
    )

    batch_size: int = 64
    pairs_per_epoch: int = 60000
    variant: str = "efficient"
    val_pairs: int = 5000
    test_pairs: int = 10000

    def make_loaders(
        self, data_root: DataSource | str | None, device: torch.device, test: bool, shard: dict
    ) -> Loaders:
        ev = shard["eval"]
        tr = get_dataset(self.dataset, data_root, "train")
        if self.train_subset:
            tr = tr.subset(self.train_subset)
        va = get_dataset(self.dataset, data_root, "val")
        train = MultiMNISTLoader(
            tr, self.pairs_per_epoch, shard["batch_size"], self.variant, seed=self.seed, device=device, **shard["rank"]
        )
        val = MultiMNISTLoader(
            va, self.val_pairs, 256, self.variant, seed=self.seed + 1, fresh=False, shuffle=False, device=device, **ev
        )
        test_loader = None
        if test:
            te = get_dataset(self.dataset, data_root, "test")
            test_loader = MultiMNISTLoader(
                te,
                self.test_pairs,
                256,
                self.variant,
                seed=self.seed + 2,
                fresh=False,
                shuffle=False,
                device=device,
                **ev,
            )
        return Loaders(train, val, test_loader, tr, f"multimnist-{self.variant} from {tr.name}", True)

    def check_data(self, model: nn.Module, loaders: Loaders) -> None:
        return None  # pairs are built at the model's size

    def evaluation_sets(self, data_root: DataSource | str | None = None) -> dict[str, Any]:
        """The validation and test pairs of the run's own evaluation loaders (labels ``[n, 2]``; a shipped checkpoint
        counts an image right when both digits are among its two highest scores)."""
        loaders = self.make_loaders(data_root, torch.device("cpu"), True, _shard(self, None))
        return {"val": loaders.val.pairs(), "test": loaders.test.pairs()}


@dataclass
class EfficientMultiMNISTRecipe(MultiMNISTRecipe):
    """Efficient-CapsNet on MultiMNIST (Mazzia et al. 2021, Efficient-CapsNet variant of the pairs: 36x36,
    shifts up to +-6 px, partners of a different class). Margin loss on the two-hot target + 0.196 x MSE of
    each digit decoded separately; Adam, lr x ``lr_decay`` per epoch. The official run trains 10 x 60,000 pairs
    per epoch for many epochs."""

    name: ClassVar[str] = "efficient_multimnist"

    epochs: int = 10
    lr_decay: float = 0.95
    lr_min: float = 5e-5
    adam_eps: float = 1e-7
    recon_weight: float = 0.196
    model: EfficientCapsNetConfig = field(default_factory=EfficientCapsNetConfig.multimnist)

    model_kind: ClassVar[str] = "efficient_capsnet"

    def build_objective(self) -> Any:
        return MultiDigitObjective(self.recon_weight)

    def lr_factor(self, step: int) -> float:
        return _epoch_decay(self, step)

    def describe(self, model: nn.Module) -> dict[str, Any]:
        return {**_efficient_describe(model), "accuracy": "both digits among the two longest capsules"}


def _capsnet_multimnist_config() -> CapsNetConfig:
    return CapsNetConfig(image_size=36, mask_k=2)


@dataclass
class CapsNetMultiMNISTRecipe(MultiMNISTRecipe):
    """Sabour et al. (2017) CapsNet on MultiMNIST: the MNIST network at 36x36 (primary grid 10x10, 3,200 primary
    capsules), Sabour's pairs (shifts up to +-4 px), margin loss on the two-hot target + 0.0005 x the summed
    squared error of each digit decoded alone from its capsule (the paper's segmentation), Adam lr 1e-3 x0.96
    every 2,000 steps as for MNIST. The paper trains on 60 million generated pairs; ``pairs_per_epoch`` x
    ``epochs`` sets how many this run sees (a GPU recipe)."""

    name: ClassVar[str] = "capsnet_multimnist"
    scheduler_step: ClassVar[str] = "batch"
    notes: ClassVar[dict[str, str]] = {"accuracy": "both digits right"}

    epochs: int = 50
    batch_size: int = 128
    variant: str = "sabour"
    lr_decay: float = 0.96
    lr_decay_steps: int = 2000
    recon_weight: float = 0.0005
    model: CapsNetConfig = field(default_factory=_capsnet_multimnist_config)

    model_kind: ClassVar[str] = "capsnet"

    def build_objective(self) -> Any:
        return MultiDigitObjective(self.recon_weight, recon_reduction="sum")

    def lr_factor(self, step: int) -> float:
        return self.lr_decay ** (step / self.lr_decay_steps)
