"""The speedrun recipes: the papers' networks (architectures and parameter counts unchanged) trained for accuracy per
minute of a GPU. What changes against each paper recipe is how it is trained, never what is trained:

* the data stay on the training device (``device_data``: indexed and augmented there, the paper's augmentation);
* the schedule is laid out over the run: a linear warm-up from a tenth of the peak learning rate over
  ``warmup_epochs``, the peak held until ``hold_epochs``, then a linear decay to ``final_lr`` x the peak at the last
  epoch (:meth:`SpeedrunRecipe.lr_factor`, per batch);
* an exponential moving average of the weights (``ema``, :class:`~capsule_lib.train.ema.WeightAverage`) is what is
  validated, selected and shipped;
* the training step is compiled (``compile``, ``torch.compile``'s mode) and float32 matrix products use TF32 on a
  GPU (``matmul_precision``); one batch shape per run (the last, smaller batch of an epoch is dropped);
* with a time budget (``train(..., budget_minutes=)``, the speedrun command's cap per run), the run's length is
  fitted once the peak phase is over: after ``hold_epochs`` epochs, ``epochs`` becomes the number of epochs that
  fit in what is left of the budget at the last epoch's pace (at most the recipe's ``epochs``), recorded in
  ``history.meta["epochs_fitted"]``; a run without a budget trains ``epochs``; a fitted run that is resumed (in
  another session, with or without a budget) trains to its fitted epochs on the same schedule.

Selection on the validation split; the test split is read once, as for every recipe. ``minutes`` is the share of the
speedrun command's time a recipe asks for, ``thresholds`` the validation accuracies whose crossing time it reports.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ...models.baselines import BaselineCNNConfig
from ...models.em_capsnet import EMCapsNetConfig
from .cifar import TsaiCifarRecipe
from .mnist import BaselineCNNRecipe, CapsNetMultiMNISTRecipe, CapsNetRecipe, EfficientCapsNetRecipe
from .viewpoints import EMNorbRecipe, _norb_em_config

__all__ = [
    "SpeedrunRecipe",
    "CapsNetSpeedrun",
    "BaselineCNNSpeedrun",
    "EfficientCapsNetSpeedrun",
    "EMNorbSpeedrun",
    "TsaiCifarSpeedrun",
    "CapsNetMultiMNISTSpeedrun",
    "SPEEDRUNS",
]


@dataclass
class SpeedrunRecipe:
    """What the speedrun recipes share (see the module docstring): a mixin listed first, before the paper recipe,
    whose model, data, objective, optimiser and other settings stay as they are. It declares only its own fields (a
    mixin that inherited :class:`~capsule_lib.train.recipes.base.Recipe` would bring the base defaults of ``lr``,
    ``batch_size`` or ``dataset`` back over the paper recipe's)."""

    scheduler_step: ClassVar[str] = "batch"
    #: the share of the speedrun command's minutes this recipe asks for (on a GPU)
    minutes: ClassVar[float] = 1.0
    #: validation accuracies whose first crossing (wall time) the speedrun command reports
    thresholds: ClassVar[tuple[float, ...]] = ()
    #: the paper recipe this one speeds up (what the results page compares it with)
    paper_recipe: ClassVar[str] = ""
    #: the minutes of the command's cap kept for what is not training (loading or rendering the data, building the
    #: model, and exporting, which evaluates the validation and test sets again); at most half a short cap
    #: (:data:`capsule_lib.train.timed.RESERVE_SHARE`)
    reserve_minutes: ClassVar[float] = 0.25

    device_data: bool = True  # the datasets on the training device, batched and augmented there
    ema: float | None = 0.999
    compile: str | None = "default"
    matmul_precision: str = "high"
    warmup_epochs: float = 1.0
    hold_epochs: float = 2.0
    final_lr: float = 0.0

    def lr_factor(self, step: int) -> float:
        per_epoch = getattr(self, "_steps_per_epoch", 1)
        warm = max(1.0, self.warmup_epochs * per_epoch)
        hold = max(warm, self.hold_epochs * per_epoch)
        total = max(hold + 1.0, self.epochs * per_epoch)
        if step < warm:
            return 0.1 + 0.9 * step / warm
        if step < hold:
            return 1.0
        return self.final_lr + (1.0 - self.final_lr) * max(0.0, total - step) / (total - hold)

    def train_loader_options(self) -> dict[str, Any]:
        return {"resident": self.device_data, "drop_last": True}

    def eval_loader_options(self) -> dict[str, Any]:
        return {"resident": self.device_data}

    def training_callbacks(self, budget_minutes: float | None) -> tuple:
        return (_FitToBudget(self, budget_minutes),)

    def validate(self) -> None:
        super().validate()
        name = self.name or type(self).__name__
        if self.ema is not None and not (isinstance(self.ema, float) and 0.0 < self.ema < 1.0):
            raise ValueError(f"{name}: ema must be null or a float in (0, 1), got {self.ema!r}")
        if not 0.0 <= self.warmup_epochs <= self.hold_epochs:
            raise ValueError(
                f"{name}: need 0 <= warmup_epochs <= hold_epochs, got {self.warmup_epochs}, {self.hold_epochs}"
            )
        if not 0.0 <= self.final_lr <= 1.0:
            raise ValueError(f"{name}: final_lr (a fraction of the peak) must be in [0, 1], got {self.final_lr!r}")


class _FitToBudget:
    """After epoch ``ceil(hold_epochs)``: ``epochs`` <- the epochs that fit in the rest of the budget at that epoch's
    pace (never more than the recipe's), in the recipe (its schedule) and the trainer (its loop). A resumed run goes
    on with the epochs fitted before (its schedule unchanged), with or without a budget (``None``: no fit)."""

    def __init__(self, recipe: SpeedrunRecipe, budget_minutes: float | None) -> None:
        self.recipe, self.budget_s = recipe, None if budget_minutes is None else 60.0 * budget_minutes

    def resumed(self, trainer: Any) -> None:
        fitted = trainer.history.meta.get("epochs_fitted")
        if fitted:
            self.recipe.epochs = trainer.epochs = fitted["epochs"]

    def __call__(self, trainer: Any, record: dict[str, Any]) -> None:
        if self.budget_s is None:
            return
        at = max(1, math.ceil(self.recipe.hold_epochs))
        if record.get("partial") or record["epoch"] != at or "epochs_fitted" in trainer.history.meta:
            return
        left = self.budget_s - record["wall_time"]
        # 90 %: later epochs ran up to 30 % slower than the second on an H200 (Efficient-CapsNet: 5.6 s -> 7.2 s), and
        # a run cut before its decay ends keeps a learning rate far from its floor
        fitted = min(self.recipe.epochs, at + max(0, math.floor(0.9 * left / record["epoch_time"])))
        trainer.history.meta["epochs_fitted"] = {
            "epochs": fitted,
            "planned": self.recipe.epochs,
            "at_epoch": at,
            "epoch_time_s": record["epoch_time"],
            "budget_minutes": self.budget_s / 60.0,
        }
        self.recipe.epochs = trainer.epochs = fitted


@dataclass
class CapsNetSpeedrun(SpeedrunRecipe, CapsNetRecipe):
    """Sabour et al.'s CapsNet (8.2 M parameters, 3 routing iterations, reconstruction 0.0005) with its +-2 px
    shifts, Adam at the paper's 1e-3 and batch 128, on the speedrun schedule (up to 80 epochs)."""

    name: ClassVar[str] = "capsnet_speedrun"
    minutes: ClassVar[float] = 3.3
    thresholds: ClassVar[tuple[float, ...]] = (0.99, 0.995, 0.996, 0.997)
    paper_recipe: ClassVar[str] = "capsnet"

    epochs: int = 80


@dataclass
class BaselineCNNSpeedrun(SpeedrunRecipe, BaselineCNNRecipe):
    """The plain CNN baseline with CapsNet's speedrun pipeline (data, shifts, schedule, EMA, batch, Adam), for the
    time-to-accuracy comparison (up to 30 epochs); not compiled (cuDNN's convolutions leave little to fuse, and a
    short run would spend its time compiling)."""

    keep_epochs: ClassVar[bool] = False
    name: ClassVar[str] = "baseline_cnn_speedrun"
    minutes: ClassVar[float] = 0.8
    thresholds: ClassVar[tuple[float, ...]] = (0.99, 0.995, 0.996, 0.997)
    paper_recipe: ClassVar[str] = "baseline_cnn"

    epochs: int = 30
    compile: str | None = None
    model: BaselineCNNConfig = field(default_factory=BaselineCNNConfig)


@dataclass
class EfficientCapsNetSpeedrun(SpeedrunRecipe, EfficientCapsNetRecipe):
    """Mazzia et al.'s Efficient-CapsNet (161 K parameters without the decoder) with the official augmentation and
    loss; batch 128 instead of 16 with the peak learning rate scaled by the square-root rule (5e-4 x sqrt(8) =
    1.4e-3), on the speedrun schedule (up to 100 epochs; the official run is 150 epochs at batch 16)."""

    name: ClassVar[str] = "efficient_speedrun"
    minutes: ClassVar[float] = 2.8
    thresholds: ClassVar[tuple[float, ...]] = (0.99, 0.995, 0.996, 0.997)
    paper_recipe: ClassVar[str] = "efficient"

    epochs: int = 100
    batch_size: int = 128
    lr: float = 1.4e-3


@dataclass
class EMNorbSpeedrun(SpeedrunRecipe, EMNorbRecipe):
    """Hinton et al.'s EM capsule network in the paper's small configuration (A=64, B=8, C=D=16, 3 iterations) on the
    viewpoint protocol of :class:`~capsule_lib.train.recipes.viewpoints.EMNorbRecipe` on the GENERATED rendered set
    (the data of the shipped EM checkpoints; smallNORB itself has no offline copy), with its augmentation,
    spread loss and Adam at 1e-2), on the speedrun schedule (up to 40 epochs; the CPU recipe: 15 epochs, lr x0.85
    per epoch). Not compiled (the EM iterations are many small operations; eager on the GPU)."""

    name: ClassVar[str] = "em_norb_speedrun"
    minutes: ClassVar[float] = 2.0
    reserve_minutes: ClassVar[float] = 1.0  # the rendered set is made twice (training, export): 77 s on an H200 host
    thresholds: ClassVar[tuple[float, ...]] = (0.8, 0.9, 0.95)
    paper_recipe: ClassVar[str] = "em_norb"

    epochs: int = 40
    dataset: str = "rendered_norb"
    compile: str | None = None
    model: EMCapsNetConfig = field(default_factory=_norb_em_config)


@dataclass
class TsaiCifarSpeedrun(SpeedrunRecipe, TsaiCifarRecipe):
    """Tsai et al.'s CIFAR-10 network (resnet backbone, 1.83 M parameters, 2 iterations) with the paper's crop and
    flip, SGD with momentum 0.9 and weight decay 5e-4 at the paper's peak 0.1 and batch 128, on the speedrun schedule
    (up to 60 epochs; the paper: 350)."""

    name: ClassVar[str] = "tsai_cifar10_speedrun"
    minutes: ClassVar[float] = 9.0
    reserve_minutes: ClassVar[float] = 0.5
    thresholds: ClassVar[tuple[float, ...]] = (0.8, 0.9, 0.92, 0.94)
    paper_recipe: ClassVar[str] = "tsai_cifar10"

    epochs: int = 60


@dataclass
class CapsNetMultiMNISTSpeedrun(SpeedrunRecipe, CapsNetMultiMNISTRecipe):
    """Sabour et al.'s MultiMNIST CapsNet (36x36, 3,200 primary capsules) on fresh pairs every epoch, on the speedrun
    schedule (up to 60 epochs of 59,904 pairs; the paper sees 60 million pairs). The pairs are made on the CPU each
    epoch and sent to the device batch by batch (``device_data`` off: the one part of a speedrun not on the
    device)."""

    name: ClassVar[str] = "capsnet_multimnist_speedrun"
    minutes: ClassVar[float] = 8.0
    reserve_minutes: ClassVar[float] = 0.5
    thresholds: ClassVar[tuple[float, ...]] = (0.8, 0.9, 0.95)
    paper_recipe: ClassVar[str] = "capsnet_multimnist"

    epochs: int = 60
    pairs_per_epoch: int = 59904  # 468 batches of 128: one batch shape
    device_data: bool = False


#: the speedrun recipes, in the order the command runs them by default
SPEEDRUNS: tuple[type[SpeedrunRecipe], ...] = (
    CapsNetSpeedrun,
    EfficientCapsNetSpeedrun,
    EMNorbSpeedrun,
    BaselineCNNSpeedrun,
    TsaiCifarSpeedrun,
    CapsNetMultiMNISTSpeedrun,
)
