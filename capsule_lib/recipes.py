"""The papers' training recipes: one dataclass per recipe, whose defaults are the paper's settings.

A recipe says *what* to train (data, model, objective, optimiser, schedule, augmentation); the one entry point
that trains any of them is :func:`capsule_lib.train.train` (also the command line,
``python -m capsule_lib.train <recipe> --set key=value``). Recipes are looked up by name in :data:`RECIPES`
and built with overrides by :func:`make_recipe`; ``model.<field>`` overrides reach the model config.

=================================  ==========================================================================
name                               recipe
=================================  ==========================================================================
``capsnet``                        :class:`CapsNetRecipe` (Sabour et al. 2017, MNIST)
``baseline_cnn``                   :class:`BaselineCNNRecipe` (the CNN baseline on CapsNet's budget)
``efficient``                      :class:`EfficientCapsNetRecipe` (Mazzia et al. 2021, MNIST)
``efficient_multimnist``           :class:`EfficientMultiMNISTRecipe` (Mazzia et al. 2021, MultiMNIST pairs)
``capsnet_multimnist``             :class:`CapsNetMultiMNISTRecipe` (Sabour et al. 2017, MultiMNIST pairs)
``em_norb``                        :class:`EMNorbRecipe` (Hinton et al. 2018, smallNORB novel-viewpoint protocol)
``baseline_cnn_norb``              :class:`NorbCNNRecipe` (a CNN of EM's size, same protocol, data and budget)
``heinsen_norb``                   :class:`HeinsenNorbRecipe` (Heinsen 2019, same protocol, 48 x 48 full views)
``baseline_cnn_norb48``            :class:`NorbCNN48Recipe` (a CNN of Heinsen's size, same data and budget)
``heinsen_sequences``              :class:`HeinsenSequenceRecipe` (Heinsen's head on GENERATED token sequences)
``tsai_cifar10``                   :class:`TsaiCifarRecipe` (Tsai et al. 2020, CIFAR-10, the paper's recipe)
``tsai_cifar10_cpu``               :class:`TsaiCifarCPURecipe` (its CPU-sized variant, one-cycle schedule)
``baseline_backbone_cifar10_cpu``  :class:`BackboneCifarCPURecipe` (that variant's backbone + a linear head)
``routing_compare_mnist``          :class:`RoutingCompareRecipe` (one network, each routing, MNIST, equal time)
``routing_compare_norb``           :class:`RoutingCompareNorbRecipe` (the same on the viewpoint protocol)
=================================  ==========================================================================
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from .data import get_dataset
from .data.sequences import marker_sequences
from .data.smallnorb import heinsen_transform, hinton_transform
from .data.transforms import efficient_mnist_augment, random_crop_flip, random_shift
from .data.viewpoints import ViewpointSets, viewpoint_sets
from .distributed import DistInfo
from .models.baselines import BaselineCNN, BaselineCNNConfig
from .models.capsnet import CapsNet, CapsNetConfig
from .models.efficient import EfficientCapsNet, EfficientCapsNetConfig
from .models.em_capsnet import EMCapsNet, EMCapsNetConfig
from .models.heinsen import SmallNORBClassifier, SmallNORBConfig, TokenSequenceClassifier, TokenSequenceConfig
from .models.inverted import CIFAR10_MEAN, CIFAR10_STD, BackboneClassifier, CapsModel, CapsModelConfig
from .models.routing_classifier import RoutingClassifier, RoutingClassifierConfig
from .training import (
    CapsuleObjective,
    ClassifierObjective,
    MultiDigitObjective,
    ScoreObjective,
    SpreadObjective,
    TensorLoader,
)

__all__ = [
    "Recipe",
    "Loaders",
    "ShiftDecayRecipe",
    "CapsNetRecipe",
    "BaselineCNNRecipe",
    "EfficientCapsNetRecipe",
    "MultiMNISTRecipe",
    "EfficientMultiMNISTRecipe",
    "CapsNetMultiMNISTRecipe",
    "MultiMNISTLoader",
    "ViewpointRecipe",
    "EMNorbRecipe",
    "NorbCNNRecipe",
    "ShiftViewpointRecipe",
    "HeinsenNorbRecipe",
    "NorbCNN48Recipe",
    "HeinsenSequenceRecipe",
    "TsaiCifarRecipe",
    "TsaiCifarCPURecipe",
    "BackboneCifarCPURecipe",
    "RoutingCompareRecipe",
    "RoutingCompareNorbRecipe",
    "RECIPES",
    "make_recipe",
    "recipe_config",
    "check_device_available",
]


class Loaders(NamedTuple):
    """What :meth:`Recipe.loaders` returns: the three loaders (``test`` may be ``None``), the training
    dataset, and how the run names its data in the history (``dataset``, ``generated_data``)."""

    train: Any
    val: Any
    test: Any
    train_set: Any
    dataset: str
    generated_data: bool


@dataclass
class Recipe:
    """Fields and defaults every recipe shares; a subclass sets :attr:`name` and overrides what differs.

    ``dataset`` names a :func:`~capsule_lib.data.get_dataset` dataset; ``train_subset`` / ``eval_subset``
    keep only the first N images (smoke runs); ``device`` is ``"auto"``, ``"cpu"``, ``"cuda"``...; ``amp``
    ``None``, ``"bf16"`` or ``"fp16"`` (autocast).
    """

    #: the recipe's name in :data:`RECIPES`, in the command line and in the run's history
    name: ClassVar[str] = ""
    #: ``"batch"`` or ``"epoch"``, when the schedule steps
    scheduler_step: ClassVar[str] = "epoch"
    #: keep the weights of every epoch (``epoch_NNN.pt``) in the run folder
    keep_epochs: ClassVar[bool] = False

    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    dataset: str = "mnist"
    train_subset: int | None = None
    eval_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None

    # ------------------------------------------------------------------ what a subclass provides
    def build_model(self) -> nn.Module:
        """The model, from ``self.model`` (the model config)."""
        raise NotImplementedError

    def build_objective(self) -> Any:
        """The objective (loss, accuracy and logged parts) the :class:`~capsule_lib.training.Trainer` calls."""
        raise NotImplementedError

    def lr_factor(self, step: int) -> float:
        """The learning-rate multiplier after ``step`` scheduler steps (batches or epochs, see
        :attr:`scheduler_step`)."""
        return 1.0

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        """Training augmentation of one batch (the identity by default)."""
        return batch

    def has_augmentation(self) -> bool:
        """Whether :meth:`augment_batch` does anything (else the loader skips it)."""
        return False

    # ------------------------------------------------------------------ shared implementations
    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """Adam with the recipe's ``lr`` (and ``adam_eps`` where the recipe has one)."""
        return torch.optim.Adam(model.parameters(), lr=self.lr, eps=getattr(self, "adam_eps", 1e-8))

    def loaders(
        self,
        data_root: str | None,
        device: torch.device,
        *,
        test: bool = True,
        standin: bool | None = None,
        dist: DistInfo | None = None,
    ) -> Loaders:
        """Training (augmented, shuffled), validation and test loaders; the test loader is ``None`` unless
        ``test``. ``standin`` is passed to :func:`~capsule_lib.data.get_dataset`. In a distributed job
        (``dist``) every loader is this rank's shard and the training batch is this rank's share of the
        recipe's (global) ``batch_size``."""
        shard = _shard(self, dist)
        tr = get_dataset(self.dataset, data_root, "train", standin=standin)
        va = get_dataset(self.dataset, data_root, "val", standin=standin)
        te = get_dataset(self.dataset, data_root, "test", standin=standin) if test else None
        if self.train_subset:
            tr = tr.subset(self.train_subset)
        if self.eval_subset:
            va = va.subset(self.eval_subset)
            te = te.subset(self.eval_subset) if te is not None else None
        train = TensorLoader.from_dataset(
            tr,
            shard["batch_size"],
            shuffle=True,
            seed=self.seed,
            transform=self.augment_batch if self.has_augmentation() else None,
            device=device,
            **shard["rank"],
        )
        val = TensorLoader.from_dataset(va, 256, device=device, pad_shards=False, **shard["rank"])
        test_loader = None
        if te is not None:
            test_loader = TensorLoader.from_dataset(te, 256, device=device, pad_shards=False, **shard["rank"])
        return Loaders(train, val, test_loader, tr, tr.name, tr.generated)

    def evaluation_sets(self, data_root: str | None = None, standin: bool | None = None) -> dict[str, Any]:
        """The datasets a shipped checkpoint of this recipe is evaluated on, by metric prefix (``"val"``,
        ``"test"``): what :func:`~capsule_lib.pretrained.export_run` records in the registry."""
        return {split: get_dataset(self.dataset, data_root, split, standin=standin) for split in ("val", "test")}

    def check_data(self, model: nn.Module, loaders: Loaders) -> None:
        """Refuse data the model cannot take (one line naming the mismatch)."""
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "image_size") or not hasattr(loaders.train_set, "images"):
            return
        want = (config.in_channels, config.image_size, config.image_size)
        got = tuple(loaders.train_set.images.shape[1:])
        if got != want:
            raise ValueError(
                f"dataset {self.dataset!r} has images {got}, the model expects {want}; "
                f"pick a matching model config ({type(config).__name__})"
            )

    def validate(self) -> None:
        """One-line ``ValueError`` for settings no run can use (checked by :func:`make_recipe`, before any data is
        loaded): ``epochs``, ``batch_size`` and the subsets positive integers, ``lr`` a number >= 0 (0 keeps the
        weights: e.g. to evaluate a start checkpoint through the loop), a known ``amp`` and a device name torch
        knows."""
        name = self.name or type(self).__name__
        for key in ("epochs", "batch_size", "train_subset", "eval_subset"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: {key} must be a positive integer, got {value!r}")
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not self.lr >= 0:
            raise ValueError(f"{name}: lr must be a number >= 0, got {self.lr!r}")
        if self.amp not in (None, "bf16", "fp16"):
            raise ValueError(f"{name}: amp must be null, 'bf16' or 'fp16', got {self.amp!r}")
        _check_device(name, self.device)

    def describe(self, model: nn.Module) -> dict[str, Any]:
        """Model facts recorded in the run's history (parameter counts...)."""
        return {"parameters": sum(p.numel() for p in model.parameters())}

    def config(self) -> dict[str, Any]:
        """The recipe's fields as plain JSON values (what the history records as ``config``)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def _check_device(name: str, device: Any) -> None:
    """``device`` is ``"auto"`` or a device name torch knows (``cpu``, ``cuda``, ``cuda:1``, ``mps``); whether this
    machine has it is checked when a run starts (:func:`check_device_available`), so that a recipe recorded on a GPU
    can still be rebuilt here (e.g. to evaluate its checkpoint)."""
    if device == "auto":
        return
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"{name}: device must be 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}") from None


def check_device_available(recipe: Recipe) -> None:
    """One line when ``recipe.device`` names a device this machine does not have (before any data is loaded)."""
    if recipe.device == "auto":
        return
    dev = torch.device(recipe.device)
    have = {
        "cpu": True,
        "cuda": torch.cuda.is_available() and (dev.index is None or dev.index < torch.cuda.device_count()),
        "mps": getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    }
    if not have.get(dev.type, False):
        raise ValueError(
            f"{recipe.name}: device {recipe.device!r} is not available on this machine (use 'auto' or 'cpu')"
        )


def _shard(recipe: Recipe, dist: DistInfo | None) -> dict[str, Any]:
    """This rank's training batch (global ``batch_size`` / world size) and its loader arguments."""
    world = dist.world_size if dist is not None else 1
    if recipe.batch_size % world:
        raise ValueError(
            f"batch_size {recipe.batch_size} (the global batch) does not split over {world} processes; "
            f"pick a multiple of {world} (--set batch_size=...)"
        )
    rank = {"rank": dist.rank, "world_size": world} if dist is not None and world > 1 else {}
    return {"batch_size": recipe.batch_size // world, "rank": rank}


@dataclass
class ShiftDecayRecipe(Recipe):
    """CapsNet's data pipeline and schedule, shared by the recipes trained on the same budget as it: +-``max_shift``
    px random shifts of the training images, and the learning rate decayed ``lr_decay ** (step /
    lr_decay_steps)`` per batch (continuous exponential decay, the official CapsNet's x0.96 every 2000 steps)."""

    scheduler_step: ClassVar[str] = "batch"

    lr_decay: float = 0.96
    lr_decay_steps: int = 2000
    max_shift: int = 2  # random +-2 px shift, training images only

    def lr_factor(self, step: int) -> float:
        return self.lr_decay ** (step / self.lr_decay_steps)

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        return (random_shift(x, self.max_shift, g), *rest)

    def has_augmentation(self) -> bool:
        return bool(self.max_shift)


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

    def build_model(self) -> nn.Module:
        return CapsNet(self.model)

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

    def build_model(self) -> nn.Module:
        return BaselineCNN(self.model)

    def build_objective(self) -> Any:
        return ClassifierObjective()


def _epoch_decay(r: Any, epoch: int) -> float:
    """``max(lr_decay ** epoch, lr_min / lr)``: Keras ``LearningRateScheduler`` per epoch, with a floor."""
    return max(r.lr_decay**epoch, r.lr_min / r.lr)


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

    def build_model(self) -> nn.Module:
        return EfficientCapsNet(self.model)

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


class MultiMNISTLoader:
    """Batches ``(merged, labels [B, 2], source_a, source_b)`` of MultiMNIST pairs built from ``source``
    digits (an :class:`~capsule_lib.data.ImageDataset`), with **fresh pairs every epoch** when ``fresh``
    (the official training stream is endless); evaluation loaders keep one fixed set (``fresh=False``)."""

    def __init__(
        self,
        source: Any,
        n: int,
        batch_size: int,
        variant: str,
        *,
        seed: int = 0,
        fresh: bool = True,
        shuffle: bool = True,
        device: torch.device | str = "cpu",
        **shard: Any,
    ) -> None:
        self.shard = shard  # rank / world_size / pad_shards for the TensorLoader (distributed jobs)
        self.source, self.n, self.batch_size, self.variant = source, n, batch_size, variant
        self.seed, self.fresh, self.shuffle, self.device = seed, fresh, shuffle, torch.device(device)
        self.epoch = 0
        self._cache: tuple[int, TensorLoader] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _loader(self) -> TensorLoader:
        from .data.multimnist import make_multimnist

        key = self.epoch if self.fresh else 0
        if self._cache is None or self._cache[0] != key:
            d = make_multimnist(
                self.source.images, self.source.labels, self.n, self.variant, seed=self.seed * 1_000_003 + key
            )
            y2 = torch.stack([d["label_a"], d["label_b"]], 1)
            self._cache = (
                key,
                TensorLoader(
                    [d["merged"], y2, d["source_a"], d["source_b"]],
                    self.batch_size,
                    shuffle=self.shuffle,
                    seed=self.seed,
                    device=self.device,
                    **self.shard,
                ),
            )
        return self._cache[1]

    def __len__(self) -> int:
        rank, world = self.shard.get("rank", 0), self.shard.get("world_size", 1)
        n = math.ceil(self.n / world) if self.shard.get("pad_shards", True) else len(range(rank, self.n, world))
        return math.ceil(n / self.batch_size)

    def __iter__(self):
        loader = self._loader()
        loader.set_epoch(self.epoch)
        return iter(loader)


@dataclass
class MultiMNISTRecipe(Recipe):
    """What the MultiMNIST recipes share: pairs of digits of different classes from the splits of ``dataset``,
    ``variant`` ``"sabour"`` (36x36, shifts up to +-4 px) or ``"efficient"`` (+-6 px), regenerated every epoch
    for training (``pairs_per_epoch``; the official streams are endless), fixed for validation (from the
    validation split) and test (from the test split). Batches ``(merged, labels [B, 2], source_a, source_b)``
    for :class:`~capsule_lib.training.MultiDigitObjective`: margin loss on the two-hot target plus
    ``recon_weight`` x the reconstruction error of each digit decoded alone. The history's accuracy is "both
    digits right" (Sabour et al.'s metric)."""

    batch_size: int = 64
    pairs_per_epoch: int = 60000
    variant: str = "efficient"
    val_pairs: int = 5000
    test_pairs: int = 10000

    def loaders(
        self,
        data_root: str | None,
        device: torch.device,
        *,
        test: bool = True,
        standin: bool | None = None,
        dist: DistInfo | None = None,
    ) -> Loaders:
        shard = _shard(self, dist)
        ev = {**shard["rank"], "pad_shards": False} if shard["rank"] else {}
        tr = get_dataset(self.dataset, data_root, "train", standin=standin)
        if self.train_subset:
            tr = tr.subset(self.train_subset)
        va = get_dataset(self.dataset, data_root, "val", standin=standin)
        train = MultiMNISTLoader(
            tr, self.pairs_per_epoch, shard["batch_size"], self.variant, seed=self.seed, device=device, **shard["rank"]
        )
        val = MultiMNISTLoader(
            va, self.val_pairs, 256, self.variant, seed=self.seed + 1, fresh=False, shuffle=False, device=device, **ev
        )
        test_loader = None
        if test:
            te = get_dataset(self.dataset, data_root, "test", standin=standin)
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

    def build_model(self) -> nn.Module:
        return EfficientCapsNet(self.model)

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

    epochs: int = 50
    batch_size: int = 128
    variant: str = "sabour"
    lr_decay: float = 0.96
    lr_decay_steps: int = 2000
    recon_weight: float = 0.0005
    model: CapsNetConfig = field(default_factory=_capsnet_multimnist_config)

    def build_model(self) -> nn.Module:
        return CapsNet(self.model)

    def build_objective(self) -> Any:
        return MultiDigitObjective(self.recon_weight, recon_reduction="sum")

    def lr_factor(self, step: int) -> float:
        return self.lr_decay ** (step / self.lr_decay_steps)

    def describe(self, model: nn.Module) -> dict[str, Any]:
        return {"parameters": sum(p.numel() for p in model.parameters()), "accuracy": "both digits right"}


@dataclass
class ViewpointRecipe(Recipe):
    """What the smallNORB viewpoint recipes share: the novel-viewpoint protocol of Hinton et al. (2018)
    (:func:`~capsule_lib.data.viewpoints.viewpoint_sets`), on ``smallnorb`` or, where it is missing and
    stand-ins are allowed, the GENERATED ``rendered_norb``, with Hinton et al.'s input pipeline: stereo pairs
    area-downscaled to ``image_size`` (48), random ``crop`` (32) crops with brightness/contrast jitter for
    training, centre crops for validation and test. Validation = a fixed part of the familiar views of the
    training instances; the test record has ``test_familiar_acc`` and ``test_novel_acc`` (test instances),
    each on a seeded random ``test_images`` per group (``None``: all).

    Subclasses set the model and the objective. ``train_subset`` / ``eval_subset`` cut the training set and
    the validation/test sets (smoke runs); ``data_seed`` seeds the rendered set (and the subsets);
    ``render_workers`` renders it in that many processes."""

    dataset: str = "smallnorb"
    axis: str = "azimuth"
    familiar: tuple[int, ...] | None = None  # None: the paper's familiar views on `axis`
    image_size: int = 48
    crop: int = 32
    brightness: float = 32 / 255
    contrast: float = 0.5
    test_images: int | None = 4000
    data_seed: int = 0
    render_workers: int = 1
    batch_size: int = 32
    epochs: int = 15
    lr: float = 3e-3
    lr_decay: float = 0.85  # x per epoch

    def viewpoint_data(self, data_root: str | None = None, standin: bool | None = None) -> ViewpointSets:
        """The protocol's four sets (:class:`~capsule_lib.data.viewpoints.ViewpointSets`)."""
        n_test = self.eval_subset or self.test_images
        return viewpoint_sets(
            self.dataset,
            data_root,
            axis=self.axis,
            familiar=self.familiar,
            size=self.image_size,
            eval_crop=self.crop,
            n_train=self.train_subset,
            n_test=n_test,
            standin=standin,
            seed=self.data_seed,
            workers=self.render_workers,
        )

    def lr_factor(self, step: int) -> float:
        return self.lr_decay**step

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        return hinton_transform(True, None, self.crop, self.brightness, self.contrast)(batch, g)

    def has_augmentation(self) -> bool:
        return True

    def loaders(
        self,
        data_root: str | None,
        device: torch.device,
        *,
        test: bool = True,
        standin: bool | None = None,
        dist: DistInfo | None = None,
    ) -> Loaders:
        shard = _shard(self, dist)
        ev = {**shard["rank"], "pad_shards": False} if shard["rank"] else {}
        sets = self.viewpoint_data(data_root, standin)
        train = TensorLoader.from_dataset(
            sets.train,
            shard["batch_size"],
            shuffle=True,
            seed=self.seed,
            transform=self.augment_batch,
            device=device,
            **shard["rank"],
        )
        val = TensorLoader.from_dataset(sets.val, 256, device=device, **ev)
        tests = None
        if test:
            tests = {
                f"test_{group}": TensorLoader.from_dataset(getattr(sets, group), 256, device=device, **ev)
                for group in ("familiar", "novel")
            }
        name = f"{sets.name} ({self.axis} protocol)"
        return Loaders(train, val, tests, sets.train, name, sets.generated)

    def evaluation_sets(self, data_root: str | None = None, standin: bool | None = None) -> dict[str, Any]:
        sets = self.viewpoint_data(data_root, standin)
        return {"val": sets.val, "test_familiar": sets.familiar, "test_novel": sets.novel}

    def check_data(self, model: nn.Module, loaders: Loaders) -> None:
        c = model.config
        got = tuple(loaders.train_set.images.shape[1:])
        if got[0] != c.in_channels or c.image_size != self.crop or got[-1] < self.crop:
            raise ValueError(
                f"{self.name}: training images {got} cropped to {self.crop} do not fit the model's input "
                f"[{c.in_channels}, {c.image_size}, {c.image_size}]; set model.image_size={self.crop}"
            )


def _norb_em_config() -> EMCapsNetConfig:
    return EMCapsNetConfig(in_channels=2, image_size=32, n_classes=5, batch_norm=True, final_lambda=0.35)


@dataclass
class EMNorbRecipe(ViewpointRecipe):
    """Hinton, Sabour & Frosst (2018), matrix capsules with EM routing, on the smallNORB viewpoint protocol
    (:class:`ViewpointRecipe`). Model: :class:`~capsule_lib.models.EMCapsNet` with the paper's small
    configuration (A=64, B=8, C=D=16, 3 iterations) fed both stereo images (2 x 32 x 32); spread loss with
    the margin growing from 0.2 to 0.9 over the run (one value per epoch).

    Where the paper is silent these are our choices, from short probe runs on the rendered set: Adam with
    lr ``1e-2`` (yl-1993's; it learned faster than ``3e-3``) x ``0.85^epoch``, batch 32, 15 epochs; BatchNorm
    after the first convolution (yl-1993; the paper has none) and ``final_lambda = 0.35`` (inverse temperatures
    0.018, 0.034, 0.050 over the 3 iterations): with ``final_lambda = 1`` and no BatchNorm the class
    activations saturate at 1 from the first step and nothing is learned."""

    name: ClassVar[str] = "em_norb"

    lr: float = 1e-2

    m_min: float = 0.2
    m_max: float = 0.9
    model: EMCapsNetConfig = field(default_factory=_norb_em_config)

    def build_model(self) -> nn.Module:
        return EMCapsNet(self.model)

    def build_objective(self) -> Any:
        return SpreadObjective(self.m_min, self.m_max)

    def describe(self, model: nn.Module) -> dict[str, Any]:
        return {"parameters": sum(p.numel() for p in model.parameters()), "scores": "class activations"}


def _norb_cnn_config() -> BaselineCNNConfig:
    return BaselineCNNConfig(
        in_channels=2, image_size=32, channels=(12, 24, 12), hidden=(16, 16), n_classes=5, dropout=0.25
    )


@dataclass
class NorbCNNRecipe(ViewpointRecipe):
    """A plain CNN (:class:`~capsule_lib.models.BaselineCNN`, 23,101 parameters, about the size of the CPU-sized
    EM network) on the same viewpoint protocol, data, augmentation, batch, epochs and schedule shape as
    :class:`EMNorbRecipe`, trained with cross-entropy and Adam at lr ``3e-3`` (EM's ``1e-2`` is tuned for the
    routing's slow start; the CNN does not need it)."""

    name: ClassVar[str] = "baseline_cnn_norb"

    model: BaselineCNNConfig = field(default_factory=_norb_cnn_config)

    def build_model(self) -> nn.Module:
        return BaselineCNN(self.model)

    def build_objective(self) -> Any:
        return ClassifierObjective()


@dataclass
class ShiftViewpointRecipe(ViewpointRecipe):
    """The viewpoint protocol of :class:`ViewpointRecipe` with Heinsen's (2019) input pipeline scaled to the
    CPU budget: the stereo pairs area-downscaled to ``image_size`` (48, half of smallNORB's 96) and used
    whole (``crop = image_size``: no crop at test time); training images get a random shift of up to
    ``max_shift`` px with edge fill (8 = Heinsen's 16 at 96 px), nothing else (no brightness or contrast
    jitter). 10 epochs (what the CPU budget of the shipped runs allowed for the Heinsen network)."""

    image_size: int = 48
    crop: int = 48
    max_shift: int = 8
    epochs: int = 10

    def augment_batch(self, batch: tuple, g: torch.Generator) -> tuple:
        return heinsen_transform(True, self.max_shift, coords=False)(batch, g)

    def has_augmentation(self) -> bool:
        return bool(self.max_shift)


def _norb_heinsen_config() -> SmallNORBConfig:
    return SmallNORBConfig(image_size=48)


@dataclass
class HeinsenNorbRecipe(ShiftViewpointRecipe):
    """Heinsen (2019) on the smallNORB viewpoint protocol, CPU-sized: the paper's
    :class:`~capsule_lib.models.SmallNORBClassifier` unchanged (271,688 parameters) fed 48 x 48 instead of
    96 x 96 stereo pairs, so its six convolutions leave a 3 x 3 grid, i.e. 576 part capsules instead of
    5,184 (about 10x less routing work). Cross-entropy on the class logits ``a_out``.

    Differences from the paper's recipe, all for the CPU budget: 10 epochs instead of 50; Adam at lr ``3e-3``
    decayed x0.85 per epoch (the schedule shape of the other viewpoint recipes) instead of RAdam with a
    single cycle peaking at ``5e-4`` (in a 2-epoch probe on 1,600 images, ``3e-3`` left chance level sooner
    than ``1e-3``); no mixup; batch 32 instead of 20; model selection on a validation split of the training
    instances (the paper's "validation" is the test set with random crops)."""

    name: ClassVar[str] = "heinsen_norb"

    lr: float = 3e-3
    model: SmallNORBConfig = field(default_factory=_norb_heinsen_config)

    def build_model(self) -> nn.Module:
        return SmallNORBClassifier(self.model)

    def build_objective(self) -> Any:
        return ClassifierObjective()

    def describe(self, model: nn.Module) -> dict[str, Any]:
        return {"parameters": sum(p.numel() for p in model.parameters()), "scores": "class logits (a_out)"}


def _norb_cnn48_config() -> BaselineCNNConfig:
    return BaselineCNNConfig(
        in_channels=2, image_size=48, channels=(32, 48, 16), hidden=(96, 64), n_classes=5, dropout=0.25
    )


@dataclass
class NorbCNN48Recipe(ShiftViewpointRecipe):
    """A plain CNN (:class:`~capsule_lib.models.BaselineCNN`, about the size of Heinsen's smallNORB model) on
    the same protocol, data, shift augmentation, batch, epochs and schedule as :class:`HeinsenNorbRecipe`,
    trained with cross-entropy and Adam at lr ``3e-3`` x0.85 per epoch."""

    name: ClassVar[str] = "baseline_cnn_norb48"
    model: BaselineCNNConfig = field(default_factory=_norb_cnn48_config)

    def build_model(self) -> nn.Module:
        return BaselineCNN(self.model)

    def build_objective(self) -> Any:
        return ClassifierObjective()


@dataclass
class HeinsenSequenceRecipe(Recipe):
    """Heinsen's (2019) sequence head (:class:`~capsule_lib.models.TokenSequenceClassifier`) on the GENERATED
    majority-marker task (:func:`~capsule_lib.data.sequences.marker_sequences`): ``n_train`` / ``n_val`` /
    ``n_test`` sequences of 16-40 tokens from seeds ``data_seed``, ``+1``, ``+2``; cross-entropy, Adam, lr
    ``3e-3`` x0.8 per epoch. ``dataset`` is fixed (``"marker_sequences"``); there is no real counterpart (SST
    needs a frozen transformer: see the chapter)."""

    name: ClassVar[str] = "heinsen_sequences"

    dataset: str = "marker_sequences"
    epochs: int = 4
    batch_size: int = 64
    lr: float = 3e-3
    lr_decay: float = 0.8
    n_train: int = 12000
    n_val: int = 2000
    n_test: int = 4000
    data_seed: int = 0
    model: TokenSequenceConfig = field(default_factory=TokenSequenceConfig)

    def build_model(self) -> nn.Module:
        return TokenSequenceClassifier(self.model)

    def build_objective(self) -> Any:
        return ClassifierObjective()

    def lr_factor(self, step: int) -> float:
        return self.lr_decay**step

    def sequences(self, split: str):
        """The split's :class:`~capsule_lib.data.sequences.TokenSequences` (``eval_subset`` / ``train_subset``
        applied)."""
        n = {"train": self.train_subset or self.n_train, "val": self.n_val, "test": self.n_test}[split]
        if split != "train" and self.eval_subset:
            n = min(n, self.eval_subset)
        seed = self.data_seed + {"train": 0, "val": 1, "test": 2}[split]
        m = self.model
        return marker_sequences(n, seed, n_markers=m.n_classes, vocab=m.vocab)

    def loaders(
        self,
        data_root: str | None,
        device: torch.device,
        *,
        test: bool = True,
        standin: bool | None = None,
        dist: DistInfo | None = None,
    ) -> Loaders:
        if self.dataset != "marker_sequences":
            raise ValueError(f"{self.name}: dataset must be 'marker_sequences' (generated), got {self.dataset!r}")
        shard = _shard(self, dist)
        ev = {**shard["rank"], "pad_shards": False} if shard["rank"] else {}
        tr = self.sequences("train")
        train = TensorLoader(
            [tr.tokens, tr.labels], shard["batch_size"], shuffle=True, seed=self.seed, device=device, **shard["rank"]
        )
        va = self.sequences("val")
        val = TensorLoader([va.tokens, va.labels], 512, device=device, **ev)
        tests = None
        if test:
            te = self.sequences("test")
            tests = TensorLoader([te.tokens, te.labels], 512, device=device, **ev)
        return Loaders(train, val, tests, tr, "marker_sequences (GENERATED)", True)

    def evaluation_sets(self, data_root: str | None = None, standin: bool | None = None) -> dict[str, Any]:
        return {"val": self.sequences("val"), "test": self.sequences("test")}

    def check_data(self, model: nn.Module, loaders: Loaders) -> None:
        return None


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

    def build_model(self) -> nn.Module:
        return CapsModel(self.model)

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

    def evaluation_sets(self, data_root: str | None = None, standin: bool | None = None) -> dict[str, Any]:
        """``val`` and ``test``, plus ``test_exact`` when the test split carries an ``exact`` mask (a copy of
        CIFAR-10 some of whose test images were recovered from a lossy source: only those marked exact are the
        original images, so that accuracy is the one to quote)."""
        sets = super().evaluation_sets(data_root, standin)
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

    def loaders(self, data_root, device, *, test=True, standin=None, dist=None) -> Loaders:
        out = super().loaders(data_root, device, test=test, standin=standin, dist=dist)
        self._steps_per_epoch = len(out.train)  # the schedule is laid out over epochs * steps per epoch
        return out

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

    def build_model(self) -> nn.Module:
        return BackboneClassifier(self.model)


@dataclass
class RoutingCompareRecipe(ShiftDecayRecipe):
    """The comparison chapter's controlled experiment: a :class:`~capsule_lib.models.RoutingClassifier` (shared
    stem and primary capsules, ``model.routing`` chooses the routing) on MNIST, with the same data, +-2 px
    shifts, Adam (lr 1e-3, x0.96 every 2000 steps, as CapsNet's recipe), batch 128 and validation-split selection
    for every routing; each routing's paper loss (:class:`~capsule_lib.training.ScoreObjective`). The runs are
    made equal in **wall-clock training time** on one machine (``train(..., budget_minutes=)``); ``epochs`` is
    only the cap (and the spread loss's margin schedule)."""

    name: ClassVar[str] = "routing_compare_mnist"

    epochs: int = 30
    model: RoutingClassifierConfig = field(default_factory=RoutingClassifierConfig)

    def build_model(self) -> nn.Module:
        return RoutingClassifier(self.model)

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

    def build_model(self) -> nn.Module:
        return RoutingClassifier(self.model)

    def build_objective(self) -> Any:
        return ScoreObjective()


#: every recipe by name
RECIPES: dict[str, type[Recipe]] = {
    cls.name: cls
    for cls in (
        CapsNetRecipe,
        BaselineCNNRecipe,
        EfficientCapsNetRecipe,
        EfficientMultiMNISTRecipe,
        CapsNetMultiMNISTRecipe,
        EMNorbRecipe,
        NorbCNNRecipe,
        HeinsenNorbRecipe,
        NorbCNN48Recipe,
        HeinsenSequenceRecipe,
        TsaiCifarRecipe,
        TsaiCifarCPURecipe,
        BackboneCifarCPURecipe,
        RoutingCompareRecipe,
        RoutingCompareNorbRecipe,
    )
}


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


#: plain annotations whose values :func:`_check_type` checks (others, e.g. nested configs, are left to their class)
_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def _check_type(owner: str, key: str, annotation: str, value: Any) -> None:
    """One line when ``value`` does not fit a field annotated ``annotation`` (``int``, ``float | None``,
    ``tuple[int, ...]``...): a command-line typo (``epochs=abc``, ``lr=fast``, ``epochs=1.5``) is refused before any
    data is loaded instead of failing deep inside training."""
    optional = annotation.endswith("|None")
    base = annotation.removesuffix("|None")
    if value is None:
        if not optional:
            raise ValueError(f"{owner}.{key} cannot be None (expected {base})")
        return
    if base in _SCALARS:
        ok = isinstance(value, _SCALARS[base]) and (base == "bool" or not isinstance(value, bool))
        if base == "int" and isinstance(value, float) and value.is_integer():
            ok = False  # 2.0 for an integer field: say so rather than truncate silently
        if not ok:
            raise ValueError(f"{owner}.{key} must be {'an integer' if base == 'int' else 'a ' + base}, got {value!r}")
    elif base.startswith("tuple[") and not isinstance(value, (tuple, list)):
        raise ValueError(f"{owner}.{key} must be a list (JSON, e.g. [1, 2]), got {value!r}")


def _set(obj: Any, key: str, value: Any) -> None:
    names = {f.name: f for f in dataclasses.fields(obj)}
    if key not in names:
        raise KeyError(f"{type(obj).__name__} has no field {key!r}; fields: {', '.join(names)}")
    annotation = str(names[key].type).replace(" ", "")
    if isinstance(value, str):  # from the command line: JSON, except for string fields
        if annotation in ("str", "str|None"):
            value = None if value == "null" and annotation == "str|None" else value
        else:
            value = _parse_value(value)
    _check_type(type(obj).__name__, key, annotation, value)
    if isinstance(value, list) and isinstance(getattr(obj, key), tuple):
        value = tuple(value)
    setattr(obj, key, value)


def make_recipe(name: str | Recipe, **overrides: Any) -> Recipe:
    """The recipe ``name`` (a key of :data:`RECIPES`, or a recipe to copy) with ``overrides`` applied.

    Keys are recipe fields, or ``model.<field>`` (also spelt ``model__<field>`` as a keyword) for the model
    config; ``model=`` replaces the whole model config. String values are parsed as JSON where the field is
    not a string (so the command line's ``--set epochs=3`` gives an ``int``). Unknown keys raise ``KeyError``
    naming the fields."""
    if isinstance(name, Recipe):
        recipe = dataclasses.replace(name)
        recipe.model = dataclasses.replace(name.model)
    else:
        if name not in RECIPES:
            raise KeyError(f"unknown recipe {name!r}; recipes: {', '.join(sorted(RECIPES))}")
        recipe = RECIPES[name]()
    for key, value in overrides.items():
        key = key.replace("__", ".")
        if key.startswith("model."):
            _set(recipe.model, key[len("model.") :], value)
        else:
            _set(recipe, key, value)
    recipe.validate()
    return recipe


def recipe_config(name: str, config: dict[str, Any]) -> Recipe:
    """Rebuild a recipe from the ``config`` a run's history recorded (the inverse of :meth:`Recipe.config`)."""
    model = config.get("model", {})
    flat = {k: v for k, v in config.items() if k != "model"}
    flat.update({f"model.{k}": v for k, v in model.items()})
    return make_recipe(name, **flat)
