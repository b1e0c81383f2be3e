"""Training recipes of the papers, as functions the chapters (``TRAIN = True``) and the command line share.

    python -m capsule_lib.recipes capsnet --epochs 15 --out runs/capsnet_mnist --data-root "$CAPSULE_DATA"

Each recipe builds data loaders (training augmentation only), the model, optimizer, schedule and objective,
then runs :class:`~capsule_lib.training.Trainer` with checkpoints and resume in ``out_dir``. ``standin`` is
passed to :func:`~capsule_lib.data.get_dataset`: ``None`` uses the generated stand-in only in offline mode
(``CAPSULE_OFFLINE=1``), ``True`` whenever the real data cannot be had (the chapters), ``False`` never.
``resume=True`` continues the run in ``out_dir`` (only the same run: see :class:`~capsule_lib.training.Trainer`);
``resume=False`` starts afresh. The test split is evaluated once, after the epoch is chosen on validation,
and recorded in ``trainer.history.meta["test"]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .data import get_dataset
from .data.transforms import efficient_mnist_augment, random_shift
from .models.baselines import BaselineCNN, BaselineCNNConfig
from .models.capsnet import CapsNet, CapsNetConfig
from .models.efficient import EfficientCapsNet, EfficientCapsNetConfig
from .training import CapsuleObjective, ClassifierObjective, MultiDigitObjective, TensorLoader, Trainer, select_device

__all__ = ["CapsNetRecipe", "train_capsnet", "hardware_string", "RECIPES", "EfficientCapsNetRecipe",
           "train_efficient_capsnet", "BaselineCNNRecipe", "train_baseline_cnn", "MultiMNISTLoader",
           "EfficientMultiMNISTRecipe", "train_efficient_multimnist"]


def hardware_string(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


@dataclass
class CapsNetRecipe:
    """Sabour et al. (2017) MNIST recipe. Defaults follow the paper/official code except where noted."""

    epochs: int = 15
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96            # official: x0.96 every 2000 steps (continuous exponential decay)
    lr_decay_steps: int = 2000
    max_shift: int = 2                # random +-2 px shift, training images only
    recon_weight: float = 0.0005      # x sum of squared pixel errors
    margin_reduction: str = "paper"
    dataset: str = "mnist"
    train_subset: int | None = None   # use only the first N training images (smoke runs)
    eval_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None
    model: CapsNetConfig = field(default_factory=CapsNetConfig)


def _loaders(recipe: Any, data_root: str | None, transform: Callable | None, device: torch.device,
             test: bool = True, standin: bool | None = None
             ) -> tuple[TensorLoader, TensorLoader, TensorLoader | None, Any]:
    tr = get_dataset(recipe.dataset, data_root, "train", standin=standin)
    va = get_dataset(recipe.dataset, data_root, "val", standin=standin)
    te = get_dataset(recipe.dataset, data_root, "test", standin=standin) if test else None
    if recipe.train_subset:
        tr = tr.subset(recipe.train_subset)
    if recipe.eval_subset:
        va = va.subset(recipe.eval_subset)
        te = te.subset(recipe.eval_subset) if te is not None else None
    train_loader = TensorLoader.from_dataset(tr, recipe.batch_size, shuffle=True, seed=recipe.seed,
                                             transform=transform, device=device)
    val_loader = TensorLoader.from_dataset(va, 256, device=device)
    test_loader = TensorLoader.from_dataset(te, 256, device=device) if te is not None else None
    return train_loader, val_loader, test_loader, tr


def train_capsnet(recipe: CapsNetRecipe | None = None, out_dir: str | Path | None = None, data_root: str | None = None,
                  callbacks: tuple = (), progress: bool = True, test: bool = True,
                  standin: bool | None = None, resume: bool = True) -> tuple[CapsNet, Trainer]:
    """Train a :class:`CapsNet`; returns the model (best validation weights loaded) and the trainer."""
    r = recipe or CapsNetRecipe()
    device = select_device(r.device)
    torch.manual_seed(r.seed)

    def augment(batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        return (random_shift(x, r.max_shift, g), *rest)

    train_loader, val_loader, test_loader, tr = _loaders(r, data_root, augment if r.max_shift else None, device, test,
                                                         standin)
    model = CapsNet(r.model)
    opt = torch.optim.Adam(model.parameters(), lr=r.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: r.lr_decay ** (step / r.lr_decay_steps))
    meta = {"recipe": "capsnet", "config": _jsonable(dataclasses.asdict(r)), "hardware": hardware_string(device),
            "torch": torch.__version__, "train_images": len(tr), "dataset": tr.name, "generated_data": tr.generated,
            "parameters": sum(p.numel() for p in model.parameters())}
    trainer = Trainer(model, CapsuleObjective(r.recon_weight, r.margin_reduction), opt, sched, scheduler_step="batch",
                      device=device, amp=r.amp, out_dir=out_dir, seed=r.seed, callbacks=callbacks, progress=progress,
                      meta=meta)
    trainer.fit(train_loader, val_loader, r.epochs, resume=resume)
    trainer.finish(test_loader)  # best validation weights; the test split is read once, now
    return model, trainer


def _jsonable(d: Any) -> Any:
    return json.loads(json.dumps(d, default=str))


RECIPES: dict[str, tuple[type, Callable[..., Any]]] = {"capsnet": (CapsNetRecipe, train_capsnet)}


@dataclass
class EfficientCapsNetRecipe:
    """Mazzia et al. (2021) Efficient-CapsNet MNIST recipe; defaults are the official ``config.json`` /
    ``models/model.py`` values.

    Adam (Keras defaults, so ``eps=1e-7``), lr 5e-4 times ``0.97^epoch`` with a floor of 5e-5 (Keras
    ``LearningRateScheduler``, per epoch), batch 16, 150 epochs; loss = margin (sum over classes, mean over
    the batch) + 0.392 x MSE (mean over pixels) of the label-masked reconstruction of the *augmented*
    image; training augmentation :func:`~capsule_lib.data.transforms.efficient_mnist_augment` (rotation,
    margin-aware shift, squish, 4x4 erase). Unlike the official code (which validates on the test set),
    the checkpoint is chosen on the validation split; the test split is evaluated for the record only.
    """

    epochs: int = 150
    batch_size: int = 16
    lr: float = 5e-4
    lr_decay: float = 0.97            # lr * lr_decay^epoch ...
    lr_min: float = 5e-5              # ... floored here
    adam_eps: float = 1e-7            # Keras Adam default (PyTorch's is 1e-8)
    recon_weight: float = 0.392       # x MSE (mean over pixels) = 0.0005 x 784
    augment: bool = True              # official MNIST augmentation, training batches only
    squish_kernel: str = "lanczos3"   # official; "bilinear" is cheaper
    dataset: str = "mnist"
    train_subset: int | None = None   # use only the first N training images (smoke runs)
    eval_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None
    model: EfficientCapsNetConfig = field(default_factory=EfficientCapsNetConfig)


def train_efficient_capsnet(recipe: EfficientCapsNetRecipe | None = None, out_dir: str | Path | None = None,
                            data_root: str | None = None, callbacks: tuple = (), progress: bool = True,
                            test: bool = True, standin: bool | None = None,
                            resume: bool = True) -> tuple[EfficientCapsNet, Trainer]:
    """Train an :class:`~capsule_lib.models.efficient.EfficientCapsNet`; returns the model (best validation
    weights loaded) and the trainer."""
    r = recipe or EfficientCapsNetRecipe()
    device = select_device(r.device)
    torch.manual_seed(r.seed)

    def augment(batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        return (efficient_mnist_augment(x, g, r.squish_kernel), *rest)

    train_loader, val_loader, test_loader, tr = _loaders(r, data_root, augment if r.augment else None, device, test,
                                                         standin)
    model = EfficientCapsNet(r.model)
    cfg = model.config
    want = (cfg.in_channels, cfg.image_size, cfg.image_size)
    if tuple(tr.images.shape[1:]) != want:
        raise ValueError(f"dataset {r.dataset!r} has images {tuple(tr.images.shape[1:])}, the model expects {want}; "
                         f"pick a matching model config (EfficientCapsNetConfig presets)")
    opt = torch.optim.Adam(model.parameters(), lr=r.lr, eps=r.adam_eps)
    floor = r.lr_min / r.lr
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: max(r.lr_decay ** epoch, floor))
    meta = {"recipe": "efficient", "config": _jsonable(dataclasses.asdict(r)), "hardware": hardware_string(device),
            "torch": torch.__version__, "train_images": len(tr), "dataset": tr.name, "generated_data": tr.generated,
            "parameters": model.num_parameters(), "parameters_with_decoder": model.num_parameters(True)}
    objective = CapsuleObjective(r.recon_weight, margin_reduction="paper", recon_reduction="mean")
    trainer = Trainer(model, objective, opt, sched, scheduler_step="epoch", device=device, amp=r.amp,
                      out_dir=out_dir, seed=r.seed, callbacks=callbacks, progress=progress, meta=meta)
    trainer.fit(train_loader, val_loader, r.epochs, resume=resume)
    trainer.finish(test_loader)  # best validation weights; the test split is read once, now
    return model, trainer


RECIPES["efficient"] = (EfficientCapsNetRecipe, train_efficient_capsnet)


@dataclass
class BaselineCNNRecipe:
    """The plain CNN baseline, trained with CapsNet's data pipeline and budget (same epochs, batch, +-2 px
    shift, Adam and schedule) and cross-entropy, for the robustness comparison."""

    epochs: int = 15
    batch_size: int = 128
    lr: float = 1e-3
    lr_decay: float = 0.96
    lr_decay_steps: int = 2000
    max_shift: int = 2
    dataset: str = "mnist"
    train_subset: int | None = None
    eval_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None
    model: BaselineCNNConfig = field(default_factory=BaselineCNNConfig)


def train_baseline_cnn(recipe: BaselineCNNRecipe | None = None, out_dir: str | Path | None = None,
                       data_root: str | None = None, callbacks: tuple = (), progress: bool = True,
                       test: bool = True, standin: bool | None = None,
                       resume: bool = True) -> tuple[BaselineCNN, Trainer]:
    """Train a :class:`~capsule_lib.models.baselines.BaselineCNN`; returns the model (best validation weights
    loaded) and the trainer."""
    r = recipe or BaselineCNNRecipe()
    device = select_device(r.device)
    torch.manual_seed(r.seed)

    def augment(batch: tuple, g: torch.Generator) -> tuple:
        x, *rest = batch
        return (random_shift(x, r.max_shift, g), *rest)

    train_loader, val_loader, test_loader, tr = _loaders(r, data_root, augment if r.max_shift else None, device, test,
                                                         standin)
    model = BaselineCNN(r.model)
    opt = torch.optim.Adam(model.parameters(), lr=r.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: r.lr_decay ** (step / r.lr_decay_steps))
    meta = {"recipe": "baseline_cnn", "config": _jsonable(dataclasses.asdict(r)), "hardware": hardware_string(device),
            "torch": torch.__version__, "train_images": len(tr), "dataset": tr.name, "generated_data": tr.generated,
            "parameters": sum(p.numel() for p in model.parameters())}
    trainer = Trainer(model, ClassifierObjective(), opt, sched, scheduler_step="batch", device=device, amp=r.amp,
                      out_dir=out_dir, seed=r.seed, callbacks=callbacks, progress=progress, meta=meta,
                      keep_epochs=True)
    trainer.fit(train_loader, val_loader, r.epochs, resume=resume)
    trainer.finish(test_loader)  # best validation weights; the test split is read once, now
    return model, trainer


RECIPES["baseline_cnn"] = (BaselineCNNRecipe, train_baseline_cnn)


class MultiMNISTLoader:
    """Batches ``(merged, labels [B, 2], source_a, source_b)`` of MultiMNIST pairs built from ``source``
    digits (an :class:`~capsule_lib.data.ImageDataset`), with **fresh pairs every epoch** when ``fresh``
    (the official training stream is endless); evaluation loaders keep one fixed set (``fresh=False``)."""

    def __init__(self, source: Any, n: int, batch_size: int, variant: str, *, seed: int = 0, fresh: bool = True,
                 shuffle: bool = True, device: torch.device | str = "cpu") -> None:
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
            d = make_multimnist(self.source.images, self.source.labels, self.n, self.variant,
                                seed=self.seed * 1_000_003 + key)
            y2 = torch.stack([d["label_a"], d["label_b"]], 1)
            self._cache = (key, TensorLoader([d["merged"], y2, d["source_a"], d["source_b"]], self.batch_size,
                                             shuffle=self.shuffle, seed=self.seed, device=self.device))
        return self._cache[1]

    def __len__(self) -> int:
        return -(-self.n // self.batch_size)

    def __iter__(self):
        loader = self._loader()
        loader.set_epoch(self.epoch)
        return iter(loader)


@dataclass
class EfficientMultiMNISTRecipe:
    """Efficient-CapsNet on MultiMNIST (Mazzia et al. 2021, Efficient-CapsNet variant of the pairs: 36x36,
    shifts up to +-6 px, partners of a different class). Margin loss on the two-hot target + 0.196 x MSE of
    each digit decoded separately; Adam, lr x ``lr_decay`` per epoch. Pairs are regenerated every epoch
    from the MNIST training split; validation pairs come from the validation split (fixed), and the test
    pairs from the test split. The official run trains 10 x 60,000 pairs per epoch for many epochs."""

    epochs: int = 10
    pairs_per_epoch: int = 60000
    batch_size: int = 64
    lr: float = 1e-3
    lr_decay: float = 0.95
    lr_min: float = 5e-5
    adam_eps: float = 1e-7
    recon_weight: float = 0.196
    variant: str = "efficient"
    val_pairs: int = 5000
    test_pairs: int = 10000
    train_subset: int | None = None
    seed: int = 0
    device: str = "auto"
    amp: str | None = None
    model: EfficientCapsNetConfig = field(default_factory=EfficientCapsNetConfig.multimnist)


def train_efficient_multimnist(recipe: EfficientMultiMNISTRecipe | None = None, out_dir: str | Path | None = None,
                               data_root: str | None = None, callbacks: tuple = (), progress: bool = True,
                               test: bool = True, dataset: str = "mnist",
                               standin: bool | None = None, resume: bool = True) -> tuple[EfficientCapsNet, Trainer]:
    """Train an Efficient-CapsNet on MultiMNIST pairs; accuracy in the history is "both digits right"."""
    r = recipe or EfficientMultiMNISTRecipe()
    device = select_device(r.device)
    torch.manual_seed(r.seed)
    tr = get_dataset(dataset, data_root, "train", standin=standin)
    if r.train_subset:
        tr = tr.subset(r.train_subset)
    va = get_dataset(dataset, data_root, "val", standin=standin)
    train_loader = MultiMNISTLoader(tr, r.pairs_per_epoch, r.batch_size, r.variant, seed=r.seed, device=device)
    val_loader = MultiMNISTLoader(va, r.val_pairs, 256, r.variant, seed=r.seed + 1, fresh=False, shuffle=False,
                                  device=device)
    test_loader = None
    if test:
        te = get_dataset(dataset, data_root, "test", standin=standin)
        test_loader = MultiMNISTLoader(te, r.test_pairs, 256, r.variant, seed=r.seed + 2, fresh=False,
                                       shuffle=False, device=device)
    model = EfficientCapsNet(r.model)
    opt = torch.optim.Adam(model.parameters(), lr=r.lr, eps=r.adam_eps)
    floor = r.lr_min / r.lr
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: max(r.lr_decay ** epoch, floor))
    meta = {"recipe": "efficient_multimnist", "config": _jsonable(dataclasses.asdict(r)),
            "hardware": hardware_string(device), "torch": torch.__version__, "train_images": len(tr),
            "dataset": f"multimnist-{r.variant} from {tr.name}", "generated_data": True,
            "parameters": model.num_parameters(), "parameters_with_decoder": model.num_parameters(True),
            "accuracy": "both digits among the two longest capsules"}
    trainer = Trainer(model, MultiDigitObjective(r.recon_weight), opt, sched, scheduler_step="epoch", device=device,
                      amp=r.amp, out_dir=out_dir, seed=r.seed, callbacks=callbacks, progress=progress, meta=meta)
    trainer.fit(train_loader, val_loader, r.epochs, resume=resume)
    trainer.finish(test_loader)  # best validation weights; the test split is read once, now
    return model, trainer


RECIPES["efficient_multimnist"] = (EfficientMultiMNISTRecipe, train_efficient_multimnist)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("recipe", choices=sorted(RECIPES))
    p.add_argument("--out", required=True, help="run directory (checkpoints, history.json); resumes if present")
    p.add_argument("--data-root", default=None)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="override recipe fields (model.FIELD for the model config), values as JSON")
    p.add_argument("--threads", type=int, default=None)
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cls, fn = RECIPES[a.recipe]
    r = cls()
    if a.epochs is not None:
        r.epochs = a.epochs
    for kv in a.set:
        k, v = kv.split("=", 1)
        target = r
        if k.startswith("model."):
            target, k = r.model, k[len("model."):]
        if not hasattr(target, k):
            raise SystemExit(f"unknown field {k!r} for {type(target).__name__}")
        setattr(target, k, _parse_value(v))
    fn(r, a.out, a.data_root, progress=False)


if __name__ == "__main__":
    main()
