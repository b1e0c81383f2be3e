"""The one training entry point: :func:`train` runs any recipe of :data:`~capsule_lib.train.recipes.registry.RECIPES`.

Chapters (``TRAIN = True``, through :func:`capsule_lib.notebook.train_or_load`), the command line
(:mod:`capsule_lib.commands.train`) and the tests all train through :func:`train`. It builds the recipe's data loaders
(training augmentation only), model, optimiser, schedule and objective, then runs
:class:`~capsule_lib.train.trainer.Trainer` with checkpoints and resume in ``out_dir``. ``data_root``, ``offline``
and ``standin`` go to :func:`~capsule_lib.data.get_dataset` as one :class:`~capsule_lib.data.DataSource`, made
here once: ``standin=None`` uses the generated stand-in only offline, ``True`` whenever the real data cannot be
had (the chapters), ``False`` never. This module reads no environment variable. ``resume=True`` continues the run
in ``out_dir`` (only the same run: see :class:`~capsule_lib.train.trainer.Trainer`); ``resume=False`` starts
afresh. The test split is evaluated once, after the epoch is chosen on validation, and recorded in
``trainer.history.meta["test"]``. :func:`~capsule_lib.train.shipped.export_run` turns a finished run into a
shipped checkpoint and its registry entry.

Layering: this module sits below :mod:`capsule_lib.pretrained`; what it needs of the shipped checkpoints
(``start_from``: a checkpoint's weights) comes from :mod:`capsule_lib.train.shipped`, in ``train/``.
"""

from __future__ import annotations

import contextlib
import json
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._checks import check_choice
from .._contracts import checked
from ..cost import check_training_memory, estimate_training_memory, time_training_step
from ..data.datasets import DataSource, check_labels, data_fingerprint
from ..data.images import ImageFacts, cache_folder, describe_images, image_facts
from ..distributed import setup as setup_distributed
from ..models.registry import network_facts
from .learning_check import LearningCheck, applies
from .recipes import make_recipe
from .recipes.base import Recipe, check_device_available
from .runtime import select_device
from .shipped import load_pretrained
from .trainer import Trainer

__all__ = ["train", "hardware_string", "start_checkpoint", "COMPILE_MODES"]

#: ``train(compile=...)`` / ``--compile``: no compilation, or a ``torch.compile`` mode for the training step
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune")


def hardware_string(device: torch.device) -> str:
    """What a run's history records as its hardware: the GPU's name, or the CPU and its thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


#: model config fields added after checkpoints were shipped, with the default every earlier checkpoint had implicitly
_LATER_FIELDS = {"stem_side": None}


def start_checkpoint(recipe: Recipe, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The weights a run starts from: the shipped checkpoint ``name``, whose model configuration must be the recipe's
    (one line otherwise: an unknown name lists the shipped ones). Checked before any data is loaded (the command line
    calls it too); returns ``(state_dict, what the run records about it)``."""
    if not isinstance(name, str):
        raise ValueError(f"start_from must be the name of a shipped checkpoint, got {name!r}")
    try:
        shipped, entry = load_pretrained(name)
    except KeyError as e:
        raise ValueError(f"start_from={name!r}: {e.args[0] if e.args else e}") from None
    want = json.loads(json.dumps(recipe.config().get("model"), default=str))
    have = {**{k: v for k, v in _LATER_FIELDS.items() if k in want}, **(entry.get("config") or {})}  # added since
    if have != want or entry.get("model") != recipe.model_kind:
        raise ValueError(
            f"start_from={name!r}: that checkpoint's model configuration differs from the recipe's "
            f"({recipe.name}); start from a checkpoint of the same model, or train from scratch"
        )
    epochs = (entry.get("training") or {}).get("epochs")
    return shipped.state_dict(), {"checkpoint": name, "sha256": entry["sha256"], "epochs": epochs}


def _check_training_data(model: nn.Module, loaders: Any) -> str | None:
    """Refuse labels outside the model's classes, in the training, validation and test sets alike (before any
    training: a test label outside the classes lowered the test accuracy silently, or failed after training); return
    the training data's content fingerprint (``None`` for a training set without ``images`` and ``labels``, e.g. a
    stream made on the fly)."""
    ds = loaders.train_set
    cfg = getattr(model, "config", None)
    n_classes = getattr(cfg, "n_classes", None) or getattr(cfg, "n_objs", None)
    splits = {"training": getattr(ds, "labels", None)}
    for split in ("val", "test"):  # the evaluation loaders' labels (a TensorLoader's second tensor)
        loader = getattr(loaders, split)
        for name, each in loader.items() if isinstance(loader, dict) else [(split, loader)]:  # or {prefix: loader}
            tensors = getattr(each, "tensors", None)
            splits[name] = tensors[1] if tensors is not None and len(tensors) > 1 else None
    for split, labels in splits.items():
        if n_classes is not None and isinstance(labels, torch.Tensor) and labels.dim() == 1:
            check_labels(labels, n_classes, f"{split} set {loaders.dataset!r}")
    if not (hasattr(ds, "images") and hasattr(ds, "labels")):
        return None
    return data_fingerprint(ds.images, ds.labels)


def _data_source(r: Recipe, out_dir: str | Path | None, source: DataSource) -> tuple[DataSource, ImageFacts | None]:
    """The run's data source, with the folder ``image_cache`` next to ``out_dir`` for the reader's decoded images,
    and, when the recipe's dataset is the reader's images, what they are, with the recipe's model fitted to them
    (classes, channels and side from the data)."""
    if out_dir is not None and source.cache is None:
        source = DataSource.of(source, cache=cache_folder(out_dir))
    images = image_facts(r.dataset, source, say=False)  # train() says the decisions, with the network they gave
    if images is not None:
        r.fit_to_images(images)
    return source, images


def _data_meta(loaders: Any, fingerprint: str | None, images: ImageFacts | None) -> dict[str, Any]:
    """What a run records of its data beyond its name: the content fingerprint (part of the run's identity: a resume
    onto other images is refused), the reader's images' decisions, and the class names (what predict names the
    scores by)."""
    meta: dict[str, Any] = {}
    if fingerprint is not None:
        meta["data_fingerprint"] = fingerprint
    if images is not None:
        meta["images"] = images.record
    if isinstance(getattr(loaders.train_set, "classes", None), list):
        meta["classes"] = list(loaders.train_set.classes)
    return meta


def _batch_like_training(loader: Any, batch_size: int) -> tuple[torch.Tensor, ...]:
    """A batch of ``batch_size`` items shaped as the training loader gives them, from the (unaugmented) validation
    loader, repeated if it holds fewer: what :func:`_images_line` times a step on."""
    parts = [torch.cat(t) for t in zip(*loader)]
    repeat = -(-batch_size // len(parts[0]))
    return tuple(t.repeat(repeat, *[1] * (t.dim() - 1))[:batch_size] for t in parts)


def _images_line(images: ImageFacts, r: Recipe, model: nn.Module, loaders: Any) -> str:
    """The one line a run on the reader's images prints: the folder's decisions (:func:`describe_images`) and what
    the network became: its parameters and the time per epoch on this machine, measured on training steps (one
    warm-up, two timed) of a batch of the run's size, on a copy of the model's state."""
    size = min(r.batch_size, len(loaders.train_set))
    step = time_training_step(model, r.build_objective(), _batch_like_training(loaders.val, size), repeats=2)
    n_val = sum(len(b[0]) for b in loaders.val)
    epoch = step * (len(loaders.train) + n_val / (3 * size))  # evaluation: a forward costs about a third of a step
    facts, memory = network_facts(model), estimate_training_memory(model, size)["bytes"]
    stem = f"; stem {facts['stem']}" if facts["stem"] else ""
    return (
        f"{describe_images(images.record)}; network: {r.name} ({r.model_kind}), {facts['parameters']:,} parameters, "
        f"{facts['primary_capsules']:,} primary capsules{stem}; about {memory / 2**30:.1f} GiB per training step and "
        f"{epoch:,.0f} s per epoch here ({step:.2f} s per step of {size} images, measured)"
    )


def _run_meta(
    r: Recipe,
    model: nn.Module,
    loaders: Any,
    dist: Any,
    data: dict[str, Any],
    start: dict[str, Any] | None,
    compile: str | None,
    precision: str | None,
) -> dict[str, Any]:
    """What a run's history records about it before its first epoch (``history.meta``)."""
    meta = {
        "recipe": r.name,
        "config": r.config(),
        "hardware": hardware_string(dist.device),
        "torch": str(torch.__version__),
        "train_images": len(loaders.train_set),
        "dataset": loaders.dataset,
        "generated_data": loaders.generated_data,
        **r.describe(model),
        **{k: v for k, v in network_facts(model).items() if k != "parameters"},  # primary capsules, stem
        **data,
    }
    if start is not None:
        meta["start_from"] = start
    if compile is not None:
        meta["compile"] = compile
    if getattr(r, "ema", None) is not None:
        meta["ema"] = r.ema  # the selected and shipped weights are the moving average
    if precision is not None:
        meta["matmul_precision"] = precision  # "high": TF32 matrix products while training
    if dist.distributed:  # recorded only for jobs of several processes
        meta.update(world_size=dist.world_size, batch_size_per_process=r.batch_size // dist.world_size)
    return meta


def _before_the_data(r: Recipe, start_from: str | None, dist: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """What is checked before any data is loaded: the shipped checkpoint a run starts from (:func:`start_checkpoint`;
    ``None`` without ``start_from``), and that one training step of the recipe's model, fitted to its images, fits in
    the device's memory at this process's batch (:func:`~capsule_lib.cost.check_training_memory`, #63)."""
    start = start_checkpoint(r, start_from) if start_from is not None else None
    check_training_memory(r.build_model(), r.batch_size // dist.world_size, dist.device)
    return start


def _check_out_dir(out_dir: str | Path | None) -> None:
    """One line when the run's folder is a file."""
    if out_dir is not None and Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise ValueError(f"out_dir {str(out_dir)!r} is a file; give a folder for the run (it is created if missing)")


@checked
def train(
    recipe: str | Recipe,
    *,
    out_dir: str | Path | None = None,
    data_root: DataSource | str | None = None,
    callbacks: tuple = (),
    progress: bool = True,
    test: bool = True,
    standin: bool | None = None,
    offline: bool | None = None,
    resume: bool = True,
    budget_minutes: float | None = None,
    start_from: str | None = None,
    compile: str | None = None,
    **overrides: Any,
) -> tuple[nn.Module, Trainer]:
    """Train a recipe: the one training entry point (chapters, the command line, the tests).

    Under ``torchrun`` the same call trains one process of a distributed job (:mod:`capsule_lib.distributed`):
    ``batch_size`` stays the global batch, split over the processes; rank 0 writes ``out_dir``.

    Parameters
    ----------
    recipe
        A name in :data:`~capsule_lib.train.recipes.registry.RECIPES` or a
        :class:`~capsule_lib.train.recipes.base.Recipe`.
    out_dir
        The run folder (``last.pt``, ``best.pt``, ``history.json``); ``None`` keeps everything in memory (no
        checkpoints, no resume).
    data_root
        Where the datasets are (:func:`~capsule_lib.data.get_dataset`): a folder, or a
        :class:`~capsule_lib.data.DataSource` (a chapter's ``cfg.data``: root, offline mode, stand-ins allowed).
        A recipe whose ``dataset`` is the reader's images (``"images:PATH"``, :mod:`capsule_lib.data.images`) has its
        model fitted to them (:meth:`~capsule_lib.train.recipes.base.Recipe.fit_to_images`) and keeps their decoded
        pixels in the folder ``image_cache`` next to ``out_dir``; the decisions are recorded in ``meta["images"]``.
    callbacks
        Called after every epoch with the trainer and the epoch's record (e.g. :class:`~capsule_lib.viz.LivePlot`).
    progress
        Show progress bars.
    test
        Evaluate the test split once, after the epoch is chosen on validation (``history.meta["test"]``).
    standin
        Passed to :func:`~capsule_lib.data.get_dataset`: ``None`` uses the generated stand-in only in offline
        mode, ``True`` whenever the real data cannot be had (the chapters), ``False`` never.
    offline
        Never download a dataset (the command line's ``--offline``); default ``False`` (or the source's).
    resume
        Continue the run in ``out_dir`` (only the same run: see :class:`~capsule_lib.train.trainer.Trainer`);
        ``False`` starts afresh.
    budget_minutes
        Stop once the run's training wall time reaches it, inside an epoch if need be (the weights reached are
        validated and recorded as a partial epoch; a later call with a larger budget goes on from there).
    start_from
        A shipped checkpoint whose weights (same model configuration) the model starts from instead of its
        initialisation; the optimiser's state and the schedule start afresh; recorded in ``meta["start_from"]``.
    compile
        One of :data:`COMPILE_MODES`: compile the training step with ``torch.compile`` in that mode
        (``"reduce-overhead"`` adds CUDA graphs on a GPU, which pays off for small, launch-bound models such as
        Efficient-CapsNet at batch 16); evaluation and checkpoints use the plain model; recorded in
        ``meta["compile"]``. Default: the recipe's ``compile`` field where it has one (the speedrun recipes).
    overrides
        Recipe fields, ``model__<field>`` for the model config (see
        :func:`~capsule_lib.train.recipes.registry.make_recipe`).

    Returns
    -------
    tuple
        ``(model, trainer)``: the model with its best validation weights loaded, and the
        :class:`~capsule_lib.train.trainer.Trainer`, whose ``history`` holds the per-epoch records and, with
        ``test``, the test accuracy of the selected epoch, and, for a run validated on one class label per image,
        whether it learned (:mod:`~capsule_lib.train.learning_check`: ``meta["learned"]`` and
        ``meta["learning_check"]``; a dead network stops after its first epoch, and a run that did not learn says so
        in one line).
    """
    r = make_recipe(recipe, **overrides)
    _check_out_dir(out_dir)
    compile = compile if compile is not None else getattr(r, "compile", None)  # the call's, else the recipe's
    check_choice(compile, COMPILE_MODES, "compile")
    check_device_available(r)
    dist = setup_distributed(select_device(r.device))  # a torchrun job, or this process alone
    device = dist.device
    source, images = _data_source(r, out_dir, DataSource.of(data_root, offline=offline, standin=standin))
    start = _before_the_data(r, start_from, dist)  # the start checkpoint; a run that cannot fit in memory refused
    torch.manual_seed(r.seed)
    loaders = r.loaders(source, device, test=test, dist=dist)
    model = r.build_model()
    if start is not None:
        model.load_state_dict(start[0])
        start = start[1]
    r.check_data(model, loaders)
    fingerprint = _check_training_data(model, loaders)
    optimizer = r.build_optimizer(model)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: r.lr_factor(step))
    precision = getattr(r, "matmul_precision", None) if device.type == "cuda" else None
    meta = _run_meta(r, model, loaders, dist, _data_meta(loaders, fingerprint, images), start, compile, precision)
    if images is not None and dist.is_main:
        print(_images_line(images, r, model, loaders), flush=True)
    check = LearningCheck(loaders.val, r.lr) if applies(loaders.val) else None  # did it learn? (after epoch 1, end)
    trainer = Trainer(
        model,
        r.build_objective(),
        optimizer,
        scheduler,
        scheduler_step=r.scheduler_step,
        device=device,
        amp=r.amp,
        out_dir=out_dir,
        seed=r.seed,
        callbacks=(*callbacks, *r.training_callbacks(budget_minutes), *([check] if check else [])),
        progress=progress,
        meta=meta,
        keep_epochs=r.keep_epochs,
        dist=dist,
        ema=getattr(r, "ema", None),
    )
    if compile is not None:  # the training step only; evaluation and checkpoints use the plain model
        trainer.net = torch.compile(trainer.net, mode=compile)
    with _matmul_precision(precision):
        trainer.fit(loaders.train, loaders.val, r.epochs, resume=resume, budget_minutes=budget_minutes)
        trainer.finish(loaders.test)  # best validation weights; the test split is read once, now
    if check is not None:
        check.finish(trainer)  # history.meta["learned"] and one line for a run that did not learn
    return model, trainer


@contextlib.contextmanager
def _matmul_precision(precision: str | None):
    """``torch.set_float32_matmul_precision(precision)`` while a run trains, the previous setting restored
    afterwards; ``None``: nothing."""
    if precision is None:
        yield
        return
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)
