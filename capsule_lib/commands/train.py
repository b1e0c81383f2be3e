"""``python -m capsule_lib.train``: parses its arguments and calls :func:`~capsule_lib.train.run.train`, the one
training entry point::

    python -m capsule_lib.train capsnet --out runs/capsnet_mnist --set epochs=15 model.iterations=3
    python -m capsule_lib.train --shipped capsnet_mnist --out runs/capsnet_mnist   # the shipped model's recipe
    python -m capsule_lib.train routing_compare_mnist --images photos --out runs/mine --set model.routing=em

A folder that holds a run is refused unless ``--resume`` (go on with that run: only the same run, see
:class:`~capsule_lib.train.trainer.Trainer`) or ``--overwrite`` (start afresh, deleting it) says what to do with it.
``--shipped`` starts from a shipped checkpoint's recipe (:func:`~capsule_lib.train.shipped.shipped_recipe`),
``--start-from`` from its weights, ``--export NAME`` turns the finished run into a shipped checkpoint and its
registry entry (:func:`~capsule_lib.train.shipped.export_run`). ``--images PATH`` trains the recipe on a folder of
your own images (:mod:`capsule_lib.data.images`: the recipe's ``dataset`` becomes ``images:PATH``, with the options
``--image-size``, ``--channels``, ``--val-fraction``, ``--test-fraction``, ``--split-seed``, ``--skip-bad-files``,
``--keep-small-classes``; the decoded images are read from and written to the cache ``image_cache`` next to
``--out``, as :func:`~capsule_lib.train.run.train` does);
the network's classes, channels and input size come from the images. The defaults of ``--data-root`` and ``--offline``
are ``CAPSULE_DATA`` / ``CAPSULE_OFFLINE``, read by :func:`capsule_lib.notebook.environment`.

Layering: a command (``capsule_lib.commands``, the top layer; nothing imports it); ``python -m capsule_lib.train``
runs ``capsule_lib/train/__main__.py``, which holds nothing but the call of :func:`main`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from ..data.datasets import DataSource
from ..data.images import ImageSource, cache_folder, image_facts
from ..train.checkpoint import CheckpointReadError
from ..train.learning_check import DID_NOT_LEARN_EXIT
from ..train.recipes import RECIPES, make_recipe
from ..train.recipes.base import check_device_available
from ..train.run import COMPILE_MODES, start_checkpoint, train
from ..train.shipped import export_run, registry, shipped_recipe
from ._arguments import (
    add_data_arguments,
    check_name,
    check_out,
    check_threads,
    cleaned_out,
    data_defaults,
    fail,
    first_line,
    interrupted,
    overrides,
    parser,
    remove_outputs,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments."""
    p = parser("python -m capsule_lib.train", __doc__)
    p.add_argument("recipe", nargs="?", choices=sorted(RECIPES), help="recipe name (or use --shipped)")
    p.add_argument("--shipped", metavar="CHECKPOINT", help="start from a shipped checkpoint's recipe")
    p.add_argument("--out", required=True, help="run directory (checkpoints, history.json)")
    p.add_argument("--resume", action="store_true", help="go on with the run in --out (the same run only)")
    p.add_argument(
        "--overwrite",
        "--fresh",
        dest="overwrite",
        action="store_true",
        help="start afresh in --out, deleting the run there (its checkpoints and history)",
    )
    add_data_arguments(p)
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="override recipe fields (model.FIELD for the model config); values as JSON; several --set add up",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads on the CPU (default: torch's)")
    p.add_argument("--export", metavar="NAME", help="export the finished run as shipped checkpoint NAME (a new name)")
    p.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop when the run's training wall time reaches this (inside an epoch if need be; resumable)",
    )
    p.add_argument("--start-from", metavar="CHECKPOINT", help="start from a shipped checkpoint's weights")
    g = p.add_argument_group(
        "your own images", "train the recipe on a folder of your images: classes, channels and size come from them"
    )
    g.add_argument("--images", metavar="PATH", help="a folder PATH/<class>/<image> (or PATH/train/, val/, test/)")
    g.add_argument("--image-size", type=int, metavar="N", help="resize to N x N (default: from the images, <= 64)")
    g.add_argument("--channels", type=int, choices=(1, 3), help="1 grey or 3 RGB (default: from the images)")
    g.add_argument("--val-fraction", type=float, metavar="F", help="held out for validation (default 0.1)")
    g.add_argument("--test-fraction", type=float, metavar="F", help="held out for test without test/ (default 0.1)")
    g.add_argument("--split-seed", type=int, metavar="S", help="seed of the held-out images (default 0)")
    g.add_argument("--skip-bad-files", action="store_true", help="skip files that are not readable images (counted)")
    g.add_argument(
        "--keep-small-classes",
        action="store_true",
        help="keep a class too small for a validation and a test image (said) instead of refusing the folder",
    )
    p.add_argument(
        "--compile",
        choices=[m for m in COMPILE_MODES if m],
        default=None,
        help="compile the training step with torch.compile in this mode (reduce-overhead: CUDA graphs)",
    )
    return p


#: what a run leaves in its folder (``--overwrite`` deletes these before the new run starts)
RUN_FILES = ["last.pt", "best.pt", "epoch_*.pt", "history.json", "*.tmp"]


#: the options of ``--images`` (argument -> :class:`~capsule_lib.data.images.ImageSource` field)
_IMAGE_OPTIONS = {
    "image_size": "image_size",
    "channels": "channels",
    "val_fraction": "val_fraction",
    "test_fraction": "test_fraction",
    "split_seed": "split_seed",
    "skip_bad_files": "skip_bad",
    "keep_small_classes": "keep_small",
}


def _images(p: argparse.ArgumentParser, a: argparse.Namespace) -> str | None:
    """The dataset name of ``--images`` and its options (``None`` without it); a bad option in one line."""
    given = {f: getattr(a, arg) for arg, f in _IMAGE_OPTIONS.items() if getattr(a, arg) is not None}
    given = {f: v for f, v in given.items() if v is not False}  # --skip-bad-files off: the default
    if a.images is None:
        if given:
            arg = next(k for k, v in _IMAGE_OPTIONS.items() if v == next(iter(given)))
            fail(p, f"--{arg.replace('_', '-')} goes with --images PATH (the folder of your images)")
        return None
    try:
        return ImageSource(a.images, **given).spec
    except ValueError as e:
        fail(p, str(e))


def main(argv: list[str] | None = None, *, data_root: str | Path | None = None, offline: bool | None = None) -> None:
    """The command line (see the module docstring).

    Exit status: 0 when the run finished (or was already finished) and learned; 2 for arguments no run can use (one
    line, before any data is loaded or anything written); 1 for a run that failed (a non-finite loss, a full disk,
    data that cannot be read: one line); 3 (:data:`~capsule_lib.train.learning_check.DID_NOT_LEARN_EXIT`) for a run
    that did not learn (validation not clearly above chance, or its class capsules saturated or collapsed: one line
    says which, why and what to try; a dead network stops after its first epoch; its checkpoints are kept and it is
    not exported); 130 after Ctrl-C (the run can be resumed with ``--resume``).

    Parameters
    ----------
    argv
        The arguments (default: ``sys.argv[1:]``).
    data_root, offline
        The defaults of ``--data-root`` and ``--offline``; ``None``: the environment's (``CAPSULE_DATA``,
        ``CAPSULE_OFFLINE``).
    """
    p = _parser()
    a = p.parse_args(argv)
    a.data_root, a.offline = data_defaults(p, a, data_root, offline)
    if (a.recipe is None) == (a.shipped is None):
        fail(p, "give a recipe name or --shipped CHECKPOINT (one of them)")
    if a.resume and a.overwrite:
        fail(p, "--resume goes on with the run in --out, --overwrite replaces it: give one of them")
    check_threads(p, a.threads)
    check_name(p, a.export, "--export")
    sets = overrides(p, a.set)
    if a.budget_minutes is not None and not (a.budget_minutes > 0 and math.isfinite(a.budget_minutes)):
        fail(p, f"--budget-minutes must be a number of minutes > 0, got {a.budget_minutes}")
    images = _images(p, a)
    if images is not None:
        if "dataset" in sets:
            fail(p, "give the data once: --images PATH or --set dataset=..., not both")
        sets["dataset"] = images
    try:  # every value checked before any data is loaded or anything written: one line, no traceback
        with interrupted(p, "checking the recipe and reading the images (nothing was written)"):
            recipe = shipped_recipe(a.shipped, **sets) if a.shipped else make_recipe(a.recipe, **sets)
            check_device_available(recipe)
            if a.start_from is not None and images is None:  # (for images, train() checks it once fitted to them)
                start_checkpoint(recipe, a.start_from)
            if images is not None:  # the folder itself (its layout, classes, files), before any training
                image_facts(
                    recipe.dataset, DataSource.of(a.data_root, offline=a.offline, cache=cache_folder(a.out)), say=False
                )
            if a.export is not None and a.export in registry():
                raise ValueError(f"--export {a.export}: a shipped checkpoint of that name exists; choose a new name")
    except (KeyError, ValueError, OSError) as e:
        fail(p, first_line(e))
    existed = check_out(p, a.out, keep="--resume", replace="--overwrite", allowed=a.resume or a.overwrite)
    if a.overwrite:
        remove_outputs(a.out, RUN_FILES)
    try:
        with cleaned_out(a.out, existed):
            _, trainer = train(
                recipe,
                out_dir=a.out,
                data_root=a.data_root,
                offline=a.offline,
                progress=False,
                resume=a.resume,
                budget_minutes=a.budget_minutes,
                start_from=a.start_from,
                compile=a.compile,
            )
    except KeyboardInterrupt as e:  # TrainingInterrupted says where the run stopped and how to resume it
        message = str(e) or "training interrupted (Ctrl-C)"
        print(message.replace("run the same command again", "run the same command with --resume"), file=sys.stderr)
        raise SystemExit(130) from None
    except (ValueError, KeyError, OSError, FloatingPointError, CheckpointReadError, torch.OutOfMemoryError) as e:
        advice = " (lower --set batch_size=...)" if isinstance(e, torch.OutOfMemoryError) else ""
        fail(p, first_line(e) + advice, code=1)  # the library's one-line refusals (data, resume, non-finite, disk)
    if trainer.dist.distributed:
        import torch.distributed as torch_dist

        torch_dist.destroy_process_group()
    if not trainer.dist.is_main:  # one process reports and exports
        return
    meta = trainer.history.meta
    print(
        json.dumps(
            {"best": trainer.history.best("val_acc"), "test": meta.get("test"), "learned": meta.get("learned")},
            default=str,
        )
    )
    if meta.get("learned") is False:  # said in one line by the run; nothing is exported from a network at chance
        if a.export:
            print(f"{p.prog}: not exported as {a.export}: the run did not learn", file=sys.stderr)
        raise SystemExit(DID_NOT_LEARN_EXIT)
    if a.export:
        try:
            entry = export_run(a.out, a.export, data_root=DataSource(a.data_root, a.offline))
        except (ValueError, KeyError, OSError) as e:
            fail(p, f"the run finished in {a.out} but its export failed: {first_line(e)}", code=1)
        print(json.dumps({k: entry[k] for k in ("file", "sha256", "metrics")}, indent=1))
