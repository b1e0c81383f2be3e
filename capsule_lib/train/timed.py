"""The speedrun: the speedrun recipes (:mod:`capsule_lib.train.recipes.speedrun`) one after another inside a
fixed number of minutes, each exported as a registry-ready checkpoint, and one JSON file saying what they reached
when::

    python -m capsule_lib.train.speedrun --minutes 9 --out runs/speedrun capsnet_speedrun efficient_speedrun
    python -m capsule_lib.train.speedrun --minutes 1 --out runs/speedrun_quick --device cpu --quick   # the tests

Every run gets a cap (:func:`budget_share`): the time left when it starts, shared among the runs still to go in
proportion to their recipes' ``minutes``; the shares are recomputed as each run starts, so a run that ends early, fails
or is skipped leaves its time to the next ones, and one that overran its cap takes it from them. A reserve for loading
the data and exporting is taken off the cap (the recipe's ``reserve_minutes``, at most :data:`RESERVE_SHARE` of the
cap: a short cap, e.g. ``--quick``'s, keeps the rest for training), the rest is the run's training budget
(``train(..., budget_minutes=)``: the speedrun recipes fit their number of epochs to it, and training stops when it
is spent). A run is skipped only when less than :data:`GONE_S` seconds of the command are left (with ``--quick``
not even then: it trains for :data:`GONE_S` and its record says ``over_time``). Runs start afresh (a timed run is not
resumed). Each finished run is exported with :func:`~capsule_lib.train.shipped.export_run` (fp16 weights, sha256,
history, the metrics of the fp16 weights) into ``OUT/checkpoints`` as ``<recipe>_<tag>`` (a registry of its own:
``OUT/checkpoints/registry.json``).

``OUT/speedrun.json`` (rewritten after every run, so a stopped command keeps what finished): the machine and
versions, the command, and per run the time left when it started, its cap and budget, the epochs planned, fitted and
trained, the selected epoch, validation and test accuracy (of the exported fp16 weights), the training wall time, the
time from start to export, and the wall time at which validation accuracy first reached each of the recipe's
``thresholds``. A run that fails (e.g. its dataset is not on this machine) is recorded with its error and the next
one starts.

``--quick``: tiny subsets, two epochs, no compilation, generated stand-ins where the data is missing, every recipe
run: a check that the command works (the unit tests run it on the CPU), not a measurement.

This module is the library function, :func:`run_speedrun`; the command ``python -m capsule_lib.train.speedrun``
(its arguments) is :mod:`capsule_lib.commands.speedrun`. Like the rest of ``train/`` it trains through
:func:`~capsule_lib.train.run.train` and exports through :mod:`capsule_lib.train.shipped`, below
:mod:`capsule_lib.pretrained`.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .._contracts import checked
from ..cost import machine_info
from ..data.datasets import DataSource
from .checkpoint import _atomic_write_text, load_history
from .recipes.registry import RECIPES, make_recipe
from .run import train
from .shipped import export_run

__all__ = ["run_speedrun", "speedrun_recipe", "run_summary", "budget_share", "QUICK", "RESERVE_SHARE", "GONE_S"]

#: what ``--quick`` sets in every recipe (and ``epochs`` 2; ``render_workers`` 1)
QUICK = {
    "train_subset": 64,
    "eval_subset": 32,
    "batch_size": 16,
    "epochs": 2,
    "warmup_epochs": 0.5,
    "hold_epochs": 1.0,
    "compile": None,
    "pairs_per_epoch": 64,
    "val_pairs": 32,
    "test_pairs": 32,
}


#: the largest part of a run's cap that its reserve (the recipe's ``reserve_minutes``) may take
RESERVE_SHARE = 0.5
#: the seconds of the command's time below which the time is gone, so that a run is not started (it is recorded as
#: skipped)
GONE_S = 1.0


@checked
def budget_share(left_minutes: float, weights: Sequence[float], reserve_minutes: float) -> tuple[float, float]:
    """The next run's cap and training budget, in minutes: ``left_minutes`` (the command's time left) shared among the
    runs still to go in proportion to their ``weights`` (their recipes' ``minutes``, the next run's first), then the
    reserve taken off the cap: ``reserve_minutes``, at most :data:`RESERVE_SHARE` of the cap.

    Returns ``(cap, budget)``, both > 0 and ``budget <= cap``; ``(0.0, 0.0)`` when less than :data:`GONE_S` seconds
    are left (``left_minutes`` may be negative: the earlier runs overran): the run is skipped."""
    if not weights or any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise ValueError(
            f"budget_share: weights must be the minutes (> 0) of the runs still to go, the next one first; got "
            f"{list(weights)}"
        )
    if reserve_minutes < 0:
        raise ValueError(f"budget_share: reserve_minutes must be >= 0, got {reserve_minutes}")
    if 60.0 * left_minutes < GONE_S:
        return 0.0, 0.0
    cap = left_minutes * (weights[0] / sum(weights))  # (the last run: all that is left, exactly)
    return cap, cap - min(reserve_minutes, RESERVE_SHARE * cap)


def _machine(device: torch.device) -> dict[str, Any]:
    info = machine_info(device)
    info["cuda"] = torch.version.cuda
    if device.type == "cuda":
        info["cudnn"] = torch.backends.cudnn.version()
        info["gpu_memory_gb"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    return info


def speedrun_recipe(name: str, device: str, quick: bool, overrides: dict[str, Any] | None = None) -> Any:
    """The recipe one speedrun run trains: ``name`` on ``device``, ``--quick``'s settings, the data workers of this
    machine, then ``overrides`` (checked by :func:`~capsule_lib.train.recipes.make_recipe`: the command checks every
    run's before the first one starts)."""
    cls = RECIPES[name]
    settings: dict[str, Any] = {"device": device}
    if quick:
        settings.update({k: v for k, v in QUICK.items() if k in cls.__dataclass_fields__})
    if "render_workers" in cls.__dataclass_fields__ and not quick:
        settings["render_workers"] = min(16, os.cpu_count() or 1)
    settings.update(overrides or {})
    return make_recipe(name, **settings)


def _one_run(
    name: str, out: Path, source: DataSource, device: str, budget: float, tag: str, quick: bool, overrides: dict
) -> dict[str, Any]:
    """Train, export and summarise one speedrun recipe."""
    run_dir = out / "runs" / name
    t0 = time.time()
    recipe = speedrun_recipe(name, device, quick, overrides)  # (train()'s `compile` would shadow the recipe field's)
    if getattr(recipe, "compile", None) is not None:  # (importing dynamo takes seconds: only for a run that compiles)
        # a step that torch.compile cannot compile runs eagerly (with dynamo's warning) instead of losing the run's time
        torch._dynamo.config.suppress_errors = True
    train(recipe, out_dir=run_dir, data_root=source, progress=False, resume=False, budget_minutes=budget)
    hist = load_history(run_dir / "history.json")
    hardware = hist.meta.get("hardware")
    records = hist.records
    wall = records[-1]["wall_time"] if records else 0.0
    notes = (
        f"Speedrun recipe {name} on {hardware} (torch {torch.__version__}): {wall:.0f} s of training "
        f"(budget {budget:.2f} min), seed {hist.meta.get('seed')}; the weights shipped are the moving average "
        f"(ema {hist.meta.get('ema')}) of the epoch chosen on the validation split; the test split was read once."
    )
    entry = export_run(
        run_dir,
        f"{name}_{tag}",
        data_root=source,
        directory=out / "checkpoints",
        device=device,
        notes=notes,
        eval_subset=QUICK["eval_subset"] if quick else None,
    )
    summary = run_summary(name, run_dir, entry)
    summary["budget_minutes"] = round(budget, 4)
    summary["total_s"] = round(time.time() - t0, 2)
    return summary


@checked
def run_summary(name: str, run_dir: str | os.PathLike, entry: dict[str, Any]) -> dict[str, Any]:
    """What ``speedrun.json`` records of one exported run of the speedrun recipe ``name``: its run folder's history
    (``run_dir``: epochs planned, fitted and trained, training wall time, the wall time at which validation first
    reached each of the recipe's ``thresholds``, the validation curve, the training settings) and its export's registry
    ``entry`` (the metrics of the fp16 weights, file, sha256)."""
    cls = RECIPES.get(name)
    if not hasattr(cls, "thresholds"):
        raise ValueError(f"run_summary: name must be a speedrun recipe (e.g. 'capsnet_speedrun'), got {name!r}")
    missing = [k for k in ("file", "sha256", "metrics") if k not in entry]
    if missing:
        raise ValueError(f"run_summary: entry must be an export's registry entry; it has no {', '.join(missing)}")
    hist = load_history(Path(run_dir) / "history.json")
    records = hist.records
    fitted = hist.meta.get("epochs_fitted") or {}
    return {
        "recipe": name,
        "checkpoint": Path(entry["file"]).stem,
        "paper_recipe": cls.paper_recipe,
        "parameters": hist.meta.get("parameters"),
        "dataset": hist.meta.get("dataset"),
        "generated_data": hist.meta.get("generated_data"),
        "epochs_planned": hist.meta["config"]["epochs"],
        "epochs_fitted": fitted.get("epochs"),
        "epochs_trained": records[-1]["epoch"] if records else 0,
        "selected_epoch": entry["metrics"]["selected_epoch"],
        "metrics": entry["metrics"],
        "test_history": hist.meta.get("test"),
        "train_wall_s": round(records[-1]["wall_time"] if records else 0.0, 2),
        "time_to_val": hist.time_to(cls.thresholds),
        "curve": [[round(r["wall_time"], 2), r.get("val_acc")] for r in records],
        "file": entry["file"],
        "sha256": entry["sha256"],
        "compile": hist.meta.get("compile"),
        "ema": hist.meta.get("ema"),
        "matmul_precision": hist.meta.get("matmul_precision"),
    }


def run_speedrun(
    names: list[str],
    minutes: float,
    out: str | os.PathLike,
    *,
    device: str = "auto",
    data_root: DataSource | str | None = None,
    offline: bool = False,
    quick: bool = False,
    tag: str | None = None,
    argv: list[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the speedrun recipes ``names`` in order inside ``minutes`` (see the module docstring); ``overrides``: recipe
    fields set in every run (e.g. ``{"amp": "bf16", "compile": None}``); returns what ``OUT/speedrun.json`` holds."""
    from .runtime import select_device

    t_start = time.time()
    deadline = t_start + 60.0 * minutes
    dev = select_device(device)
    tag = tag or ("quick" if quick else "gpu" if dev.type == "cuda" else "cpu")
    # a speedrun measures real data: a missing dataset fails its run, except in --quick (stand-ins allowed)
    source = DataSource.of(data_root, offline=offline, standin=True if quick else False)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": "python -m capsule_lib.train.speedrun " + " ".join(argv or []),
        "minutes": minutes,
        "quick": quick,
        "overrides": overrides or {},
        "compile_errors": "suppressed (a step torch.compile cannot compile runs eagerly; see the log)",
        "machine": _machine(dev),
        "runs": [],
    }
    for i, name in enumerate(names):
        left = (deadline - time.time()) / 60.0
        cap, budget = budget_share(left, [RECIPES[n].minutes for n in names[i:]], RECIPES[name].reserve_minutes)
        spent = (
            f"{60 * left:.1f} s of the command's {minutes:g} min left"
            if left >= 0
            else f"the command's {minutes:g} min are spent, {-60 * left:.0f} s over"
        )
        if cap == 0.0 and not quick:
            print(f"speedrun: {name}: skipped, no time left ({spent})", flush=True)
            result["runs"].append({"recipe": name, "skipped": f"no time left ({spent})"})
        else:
            if cap == 0.0:  # --quick checks every recipe: one with no time left still trains, for GONE_S
                budget = GONE_S / 60.0
                said = f"no time left ({spent}); --quick runs it anyway, training budget {budget:.2f} min"
            else:
                said = f"{left:.2f} min left for {len(names) - i} run(s): cap {cap:.2f} min, "
                said += f"training budget {budget:.2f} min"
            print(f"speedrun: {name}: {said}", flush=True)
            try:
                run = _one_run(name, out, source, str(dev), budget, tag, quick, dict(overrides or {}))
                run["left_minutes"], run["cap_minutes"] = round(max(left, 0.0), 4), round(cap, 4)
                if cap == 0.0:
                    run["over_time"] = f"started with no time left ({spent}): --quick runs every recipe"
                result["runs"].append(run)
                print(
                    f"speedrun: {name}: {json.dumps({k: run[k] for k in ('epochs_trained', 'train_wall_s')})} "
                    f"{json.dumps(run['metrics'])}",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001 - one failed run must not lose the others
                if not isinstance(e, (ValueError, KeyError, OSError, FloatingPointError)):  # not a one-line refusal
                    traceback.print_exc()
                first = str(e).splitlines()[0][:300] if str(e) else ""
                print(f"speedrun: {name} failed: {type(e).__name__}: {first}", file=sys.stderr, flush=True)
                result["runs"].append({"recipe": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        result["wall_s"] = round(time.time() - t_start, 2)
        _atomic_write_text(out / "speedrun.json", json.dumps(result, indent=1, default=str))
    return result
