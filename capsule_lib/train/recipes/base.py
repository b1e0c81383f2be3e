"""What every recipe shares: :class:`Recipe` (data, model, objective, optimiser, schedule, augmentation as
dataclass fields), :class:`Loaders`, the device check and the step-decay schedule of the MNIST recipes.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import torch
from torch import nn

from ..._checks import device_available
from ...cost import count_parameters
from ...data import DataSource, get_dataset
from ...data.images import ImageFacts
from ...data.loaders import TensorLoader
from ...data.transforms import random_shift
from ...distributed import DistInfo
from ...models.registry import build_model, network_facts, smallest_image_size

__all__ = ["Recipe", "Loaders", "ShiftDecayRecipe", "check_device_available", "NEAR_SIDE"]


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
    #: what :meth:`~capsule_lib.train.recipes.base.Recipe.describe` records next to the parameter count
    notes: ClassVar[dict[str, str]] = {}
    #: why the recipe cannot train on the reader's images (:mod:`capsule_lib.data.images`); empty when it can
    images_refusal: ClassVar[str] = ""

    epochs: int = 10
    batch_size: int = 128
    lr: float = 1e-3
    dataset: str = "mnist"
    train_subset: int | None = None
    eval_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None

    #: the kind of model the recipe trains (a key of :data:`capsule_lib.models.registry.MODELS`; what a shipped
    #: checkpoint of it records): ``build_model()`` builds it from ``self.model``
    model_kind: ClassVar[str]

    # ------------------------------------------------------------------ what a subclass provides
    def build_model(self) -> nn.Module:
        """The model, of :attr:`model_kind`, from ``self.model`` (the model config)."""
        return build_model(self.model_kind, self.model)

    def build_objective(self) -> Any:
        """The objective (loss, accuracy and logged parts) the :class:`~capsule_lib.train.trainer.Trainer` calls."""
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
        data_root: DataSource | str | None,
        device: torch.device,
        *,
        test: bool = True,
        dist: DistInfo | None = None,
    ) -> Loaders:
        """Training (augmented, shuffled), validation and test loaders; the test loader is ``None`` unless
        ``test``. ``data_root``: a data root or a :class:`~capsule_lib.data.DataSource` (data root, offline, stand-ins),
        passed to :func:`~capsule_lib.data.get_dataset`. In a distributed job (``dist``) every loader is this
        rank's shard and the training batch is this rank's share of the recipe's (global) ``batch_size``.
        A family builds its loaders in :meth:`make_loaders`; the number of training batches per epoch is kept for
        the schedules laid out over the run (``_steps_per_epoch``)."""
        out = self.make_loaders(data_root, device, test, _shard(self, dist))
        self._steps_per_epoch = len(out.train)
        return out

    def make_loaders(
        self, data_root: DataSource | str | None, device: torch.device, test: bool, shard: dict
    ) -> Loaders:
        """The loaders of :meth:`loaders`, given this rank's ``shard`` (``batch_size``: its training batch;
        ``rank``: its loader arguments; ``eval``: those of its evaluation loaders). Here: an image dataset's
        train / val / test splits."""
        tr = get_dataset(self.dataset, data_root, "train")
        va = get_dataset(self.dataset, data_root, "val")
        te = get_dataset(self.dataset, data_root, "test") if test else None
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
            **self.train_loader_options(),
        )
        ev = {"device": device, "pad_shards": False, **shard["rank"], **self.eval_loader_options()}
        val = TensorLoader.from_dataset(va, 256, **ev)
        test_loader = TensorLoader.from_dataset(te, 256, **ev) if te is not None else None
        return Loaders(train, val, test_loader, tr, tr.name, tr.generated)

    def train_loader_options(self) -> dict[str, Any]:
        """Keywords of the training :class:`~capsule_lib.data.loaders.TensorLoader` beyond data, batch and
        augmentation (none here; the speedrun recipes keep the data on the device and drop the last, smaller
        batch)."""
        return {}

    def eval_loader_options(self) -> dict[str, Any]:
        """Keywords of the validation and test loaders beyond data and batch (none here)."""
        return {}

    def training_callbacks(self, budget_minutes: float | None) -> tuple:
        """Callbacks the recipe adds to a run's (``cb(trainer, record)`` after every epoch); none by default."""
        return ()

    def evaluation_sets(self, data_root: DataSource | str | None = None) -> dict[str, Any]:
        """The datasets a shipped checkpoint of this recipe is evaluated on, by metric prefix (``"val"``,
        ``"test"``): what :func:`~capsule_lib.train.shipped.export_run` records in the registry."""
        return {split: get_dataset(self.dataset, data_root, split) for split in ("val", "test")}

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

    def fit_to_images(self, facts: ImageFacts) -> None:
        """Fit the model config to the reader's images (:func:`~capsule_lib.data.images.image_facts`): their
        number of classes, channels and side, and, for a network that normalises its input itself (``input_mean``,
        ``input_std``: Tsai et al.'s and its backbone baseline), the training split's mean and standard deviation.
        Images whose side is more than :data:`~capsule_lib.train.recipes.base.NEAR_SIDE` times larger or smaller
        than the network's own (the model config's ``image_size`` before fitting, or its ``stem_side`` when set)
        meet the same network behind an :class:`~capsule_lib.layers.ImageStem`: ``stem_side`` is set to the
        network's side, so that its primary capsules, routing and decoder stay the paper's at any image size (a
        smaller image is upsampled: any side is read). Nearer the network's own side the images are read as they
        are (the primary capsules, which grow with the square of the side, at most double), unless the network's
        convolutions cannot read them. One-line ``ValueError`` before anything is trained: a recipe whose data is
        not a set of labelled images (:attr:`images_refusal`), or a side smaller than the network can read (a
        ``stem_side`` set too small, or a model without the field; the smallest side is said)."""
        if self.images_refusal:
            raise ValueError(f"{self.name}: {self.images_refusal}")
        fit = {"n_classes": len(facts.classes), "in_channels": facts.channels, "image_size": facts.image_size}
        if hasattr(self.model, "input_mean"):
            fit.update(input_mean=tuple(facts.mean), input_std=tuple(max(v, 1e-3) for v in facts.std))
        paper = self.model
        if hasattr(self.model, "stem_side"):  # the network's own side: what the stem brings the images to
            own, side = self.model.stem_side or self.model.image_size, facts.image_size
            near = self.model.stem_side is None and own / NEAR_SIDE <= side <= own * NEAR_SIDE
            fit["stem_side"] = None if near else own
        self.model = dataclasses.replace(self.model, **{k: v for k, v in fit.items() if hasattr(self.model, k)})
        if getattr(self.model, "stem_side", False) is None and facts.image_size != own:  # near its side: read as is,
            if not self._reads_as_is(paper):  # unless its convolutions cannot, or its primary capsules would more
                self.model = dataclasses.replace(self.model, stem_side=own)  # than double (Efficient-CapsNet's)
        own = getattr(self.model, "stem_side", None)
        if own is not None:  # the network behind the stem must read the side the stem gives it
            smallest = smallest_image_size(self.model_kind, dataclasses.replace(self.model, stem_side=None))
            if smallest is None or own < smallest:
                raise ValueError(
                    f"{self.name}: stem_side {own} is too small for {self.model_kind}, whose convolutions need at "
                    f"least {smallest} x {smallest}; set model.stem_side={smallest} or more (or leave it unset: the "
                    f"network's own side)"
                )
            return
        smallest = smallest_image_size(self.model_kind, self.model)
        if smallest is None or facts.image_size < smallest:
            raise ValueError(
                f"{facts.where}: images of {facts.image_size} x {facts.image_size} are too small for {self.name} "
                f"({self.model_kind}), whose convolutions need at least {smallest} x {smallest}; resize them up "
                f"(--image-size {smallest}, image_size={smallest}) or train a network that reads smaller images"
            )

    def _reads_as_is(self, paper: Any) -> bool:
        """Whether the fitted model config, without a stem, reads its images (its convolutions can) with at most
        twice the primary capsules of the network on its own side (``paper``, the config before fitting, with the
        fitted channels and classes)."""
        smallest = smallest_image_size(self.model_kind, self.model)
        if smallest is None or self.model.image_size < smallest:
            return False
        same = {
            k: getattr(self.model, k)
            for k in ("in_channels", "n_classes", "input_mean", "input_std")
            if hasattr(paper, k)
        }
        counts = [
            network_facts(build_model(self.model_kind, c))["primary_capsules"] or 0
            for c in (self.model, dataclasses.replace(paper, **same))
        ]
        return counts[0] <= 2 * counts[1]

    def validate(self) -> None:
        """One-line ``ValueError`` for settings no run can use (checked by :func:`make_recipe`, before any data is
        loaded): ``epochs``, ``batch_size`` and the subsets positive integers, ``lr`` a number >= 0 (0 keeps the
        weights: e.g. to evaluate a start checkpoint through the loop), a known ``amp`` and a device name torch
        knows; every number field (of the recipe and its model config) finite; the reader's images
        (``dataset="images:PATH"``) only for a recipe of labelled images."""
        name = self.name or type(self).__name__
        for prefix, obj in (("", self), ("model.", getattr(self, "model", None))):
            if dataclasses.is_dataclass(obj):  # a NaN or an infinity in any number field (lr=1e999 parses as inf)
                for f in dataclasses.fields(obj):
                    value = getattr(obj, f.name)
                    if isinstance(value, float) and not math.isfinite(value):
                        raise ValueError(f"{name}: {prefix}{f.name} must be a finite number, got {value!r}")
        for key, (ok, what) in _RANGES.items():  # the number fields some recipes have, each in its range
            value = getattr(self, key, None)
            if value is not None and not isinstance(value, bool) and isinstance(value, (int, float)) and not ok(value):
                raise ValueError(f"{name}: {key} must be {what}, got {value!r}")
        for key in ("epochs", "batch_size", "train_subset", "eval_subset"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name}: {key} must be a positive integer, got {value!r}")
        if not isinstance(self.lr, (int, float)) or isinstance(self.lr, bool) or not self.lr >= 0:
            raise ValueError(f"{name}: lr must be a number >= 0, got {self.lr!r}")
        if self.amp not in (None, "bf16", "fp16"):
            raise ValueError(f"{name}: amp must be null, 'bf16' or 'fp16', got {self.amp!r}")
        if self.images_refusal and str(getattr(self, "dataset", "")).startswith("images:"):
            raise ValueError(f"{name}: {self.images_refusal}")
        _check_device(name, self.device)

    def describe(self, model: nn.Module) -> dict[str, Any]:
        """Model facts recorded in the run's history: the parameter count, then the recipe's :attr:`notes`."""
        return {"parameters": count_parameters(model), **self.notes}

    def config(self) -> dict[str, Any]:
        """The recipe's fields as plain JSON values (what the history records as ``config``)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


#: the ranges of the number fields that recipes share by name (checked by :meth:`Recipe.validate`): predicate, in words
_RANGES: dict[str, tuple[Any, str]] = {
    "seed": (lambda v: v >= 0, ">= 0"),
    "data_seed": (lambda v: v >= 0, ">= 0"),
    "lr_decay": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "lr_decay_steps": (lambda v: v >= 1, ">= 1"),
    "lr_min": (lambda v: v >= 0, ">= 0"),
    "adam_eps": (lambda v: v > 0, "> 0"),
    "momentum": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
    "gamma": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "warmup": (lambda v: 0 <= v < 1, "a fraction of the run in [0, 1)"),
    "recon_weight": (lambda v: v >= 0, ">= 0"),
    "m_min": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "m_max": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "brightness": (lambda v: v >= 0, ">= 0"),
    "contrast": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "max_shift": (lambda v: v >= 0, ">= 0"),
    "crop_padding": (lambda v: v >= 0, ">= 0"),
    "crop": (lambda v: v >= 1, ">= 1"),
    "image_size": (lambda v: v >= 1, ">= 1"),
    "n_train": (lambda v: v >= 1, ">= 1"),
    "n_val": (lambda v: v >= 1, ">= 1"),
    "n_test": (lambda v: v >= 1, ">= 1"),
    "test_images": (lambda v: v >= 1, ">= 1 (or null: all)"),
    "pairs_per_epoch": (lambda v: v >= 1, ">= 1"),
    "val_pairs": (lambda v: v >= 1, ">= 1"),
    "test_pairs": (lambda v: v >= 1, ">= 1"),
    "render_workers": (lambda v: v >= 1, ">= 1"),
}


#: images whose side is within this factor of a network's own side are read without a stem where their primary
#: capsules (which grow with the square of the side) stay within twice the paper's; beyond it, the stem brings them to
#: the network's side
NEAR_SIDE = 2**0.5


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
    if not device_available(torch.device(recipe.device)):
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
    evaluation = {**rank, "pad_shards": False} if rank else {}
    return {"batch_size": recipe.batch_size // world, "rank": rank, "eval": evaluation}


def _epoch_decay(r: Any, epoch: int) -> float:
    """``max(lr_decay ** epoch, lr_min / lr)``: Keras ``LearningRateScheduler`` per epoch, with a floor."""
    return max(r.lr_decay**epoch, r.lr_min / r.lr)


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
