"""The command line: ``python -m capsule_lib.train`` parses its arguments and calls
:func:`~capsule_lib.train.run.train`, the one training entry point::

    python -m capsule_lib.train capsnet --out runs/capsnet_mnist --set epochs=15 model.iterations=3
    python -m capsule_lib.train --shipped capsnet_mnist --out runs/capsnet_mnist   # the shipped model's recipe

``--shipped`` starts from a shipped checkpoint's recipe (:func:`~capsule_lib.train.shipped.shipped_recipe`),
``--start-from`` from its weights, ``--export NAME`` turns the finished run into a shipped checkpoint and its
registry entry (:func:`~capsule_lib.train.shipped.export_run`). This module reads no environment variable:
``python -m capsule_lib.train`` (``__main__``, the command above the chapters' layer) passes the defaults of
``--data-root`` and ``--offline`` from ``CAPSULE_DATA`` / ``CAPSULE_OFFLINE``, read by
:func:`capsule_lib.notebook.environment`. Like the rest of ``train/`` it imports nothing from
:mod:`capsule_lib.pretrained` or :mod:`capsule_lib.notebook`.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from ..data.datasets import DataSource
from .recipes import RECIPES, make_recipe
from .recipes.base import check_device_available
from .run import COMPILE_MODES, train
from .shipped import export_run, shipped_recipe

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command line's arguments."""
    p = argparse.ArgumentParser(
        prog="python -m capsule_lib.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("recipe", nargs="?", choices=sorted(RECIPES), help="recipe name (or use --shipped)")
    p.add_argument("--shipped", metavar="CHECKPOINT", help="start from a shipped checkpoint's recipe")
    p.add_argument("--out", required=True, help="run directory (checkpoints, history.json); resumes if present")
    p.add_argument("--data-root", default=None, help="the data root (default: $CAPSULE_DATA, else ./data)")
    p.add_argument(
        "--offline",
        action="store_true",
        default=None,
        help="never download; use generated stand-ins for missing data (default: $CAPSULE_OFFLINE)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="override recipe fields (model.FIELD for the model config); values as JSON; several --set add up",
    )
    p.add_argument("--fresh", action="store_true", help="start afresh instead of resuming the run in --out")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--export", metavar="NAME", help="export the finished run as shipped checkpoint NAME")
    p.add_argument(
        "--budget-minutes",
        type=float,
        default=None,
        help="stop when the run's training wall time reaches this (inside an epoch if need be; resumable)",
    )
    p.add_argument("--start-from", metavar="CHECKPOINT", help="start from a shipped checkpoint's weights")
    p.add_argument(
        "--compile",
        choices=[m for m in COMPILE_MODES if m],
        default=None,
        help="compile the training step with torch.compile in this mode (reduce-overhead: CUDA graphs)",
    )
    return p


def main(argv: list[str] | None = None, *, data_root: str | None = None, offline: bool = False) -> None:
    """The command line (see the module docstring); ``data_root`` and ``offline`` are the defaults of
    ``--data-root`` and ``--offline`` (``__main__`` passes the environment's)."""
    p = _parser()
    a = p.parse_args(argv)
    a.data_root = a.data_root or (str(data_root) if data_root else None)
    a.offline = offline if a.offline is None else a.offline
    if (a.recipe is None) == (a.shipped is None):
        p.error("give a recipe name or --shipped CHECKPOINT (one of them)")

    def fail(message: str) -> None:  # one line (argparse's p.error would print the whole usage first)
        print(f"{p.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)

    if a.threads is not None and a.threads < 1:
        fail(f"--threads must be >= 1, got {a.threads}")
    if a.threads:
        torch.set_num_threads(a.threads)
    overrides = {}
    for kv in a.set:
        if "=" not in kv:
            fail(f"--set wants KEY=VALUE, got {kv!r}")
        k, v = kv.split("=", 1)
        k = k.strip().replace("__", ".")  # one key, however it is spelt (model.iterations = model__iterations)
        if k in overrides and overrides[k] != v:
            fail(f"--set gives {k} twice ({overrides[k]!r} and {v!r}); give it once")
        overrides[k] = v
    if a.budget_minutes is not None and not a.budget_minutes > 0:
        fail(f"--budget-minutes must be > 0, got {a.budget_minutes}")
    try:  # every value checked before any data is loaded: one line, no traceback
        recipe = shipped_recipe(a.shipped, **overrides) if a.shipped else make_recipe(a.recipe, **overrides)
        check_device_available(recipe)
    except (KeyError, ValueError) as e:
        fail(str(e.args[0]) if e.args else str(e))
    try:
        _, trainer = train(
            recipe,
            out_dir=a.out,
            data_root=a.data_root,
            offline=a.offline,
            progress=False,
            resume=not a.fresh,
            budget_minutes=a.budget_minutes,
            start_from=a.start_from,
            compile=a.compile,
        )
    except KeyboardInterrupt as e:  # TrainingInterrupted says where the run stopped and how to resume it
        print(str(e) or "training interrupted (Ctrl-C)", file=sys.stderr)
        raise SystemExit(130) from None
    except (ValueError, FileNotFoundError, PermissionError) as e:  # the library's one-line refusals (data, resume)
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)
    if trainer.dist.distributed:
        import torch.distributed as torch_dist

        torch_dist.destroy_process_group()
    if not trainer.dist.is_main:  # one process reports and exports
        return
    print(json.dumps({"best": trainer.history.best("val_acc"), "test": trainer.history.meta.get("test")}, default=str))
    if a.export:
        entry = export_run(a.out, a.export, data_root=DataSource(a.data_root, a.offline))
        print(json.dumps({k: entry[k] for k in ("file", "sha256", "metrics")}, indent=1))
