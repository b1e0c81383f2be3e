"""The shipped checkpoints: what a training run is exported to and what a run can start from.

``capsule_lib/checkpoints/registry.json`` maps a name to an entry::

    {"file": "capsnet_mnist.pt", "sha256": "...", "model": "capsnet", "config": {...},
     "metrics": {"test_acc": 0.996, ...}, "training": {"epochs": 15, "hardware": "...", ...},
     "history": "capsnet_mnist.history.json", "notes": "..."}

:func:`export_run` turns a finished run into a shipped checkpoint (fp16 weights, sha256, history, the metrics of
the rounded weights) and its registry entry: exporting a run is training's job, so it lives in ``train/``, as does
the reading back that training needs (:func:`shipped_recipe`: the recipe a shipped checkpoint was trained with;
:func:`load_pretrained`: its weights, for ``train(start_from=...)``). :mod:`capsule_lib.pretrained`, the readers'
door to the shipped checkpoints, re-exports these names and sits above all of ``train/``: the layering is one-way,
``pretrained`` imports ``train``, never the reverse (``tests/test_architecture.py``).

:func:`load_pretrained` checks the file's sha256 and the entry's ``config_sha256`` (a sha256 of the model kind and
configuration, :func:`config_sha256`) before loading, and refuses a mismatch: a weights file replaced or a
configuration edited after export (e.g. ``iterations`` 3 -> 1) fails in one line instead of loading silently. The
configuration is also bound to the weights (``bound_sha256["config"]``, from the hash the loader computes of the kind
and configuration): an edited configuration whose ``config_sha256`` was recomputed to match is refused too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._checks import check_device
from .._contracts import checked
from ..data.datasets import DataSource
from ..models.registry import build_model
from .checkpoint import _WRITE_FIX, CheckpointWriteError, History, _load_checkpoint, _short, load_history, read_json
from .recipes import RECIPES, make_recipe, recipe_config
from .recipes.base import Recipe

__all__ = [
    "CHECKPOINT_DIR",
    "ChecksumMismatchError",
    "config_sha256",
    "registry",
    "sha256_file",
    "load_pretrained",
    "load_pretrained_history",
    "shipped_recipe",
    "export_checkpoint",
    "evaluation_metrics",
    "export_run",
    "BOUND_FIELDS",
    "EntryMismatchError",
    "bound_sha256",
]

# the shipped checkpoints' folder, capsule_lib/checkpoints (registry.json, <name>.pt, .history.json); a plain comment:
# a documented value would print this machine's absolute path on the API page
CHECKPOINT_DIR = Path(__file__).resolve().parents[1] / "checkpoints"


class ChecksumMismatchError(RuntimeError):
    """A shipped checkpoint's bytes do not match the sha256 in the registry."""


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


#: the registry fields bound to the weights file by :func:`bound_sha256`; ``config`` by the hash of the model kind and
#: configuration computed from them by the loader (:func:`config_sha256`), never the entry's own ``config_sha256``
BOUND_FIELDS: tuple[str, ...] = ("metrics", "training", "notes", "dtype", "history", "config")


class EntryMismatchError(ValueError):
    """A registry entry's field no longer matches what was exported with its weights file."""


@checked
def registry(directory: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The registry as a dict ``name -> entry`` (empty if none is shipped), every entry's bound fields checked
    (:func:`bound_sha256`): an edited or mismatched entry raises :class:`EntryMismatchError` naming the field."""
    d = Path(directory or CHECKPOINT_DIR)
    if d.exists() and not d.is_dir():
        raise ValueError(f"registry: directory {str(d)!r} is a file; give the folder that holds registry.json")
    p = d / "registry.json"
    if not p.exists():
        return {}
    try:
        reg = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{p}: the checkpoint registry is not valid JSON ({e}); restore it from the repository "
            f"(git checkout -- {p.name} in its folder) or re-export the checkpoints"
        ) from None
    for name, entry in reg.items():
        _check_bound(name, entry, d)
    return reg


def bound_sha256(entry: dict[str, Any], field: str, directory: str | os.PathLike | None = None) -> str:
    """sha256 of ``entry[field]`` bound to the entry's weights (its ``sha256``): what ``bound_sha256[field]`` records
    at export and :func:`registry` checks. For ``history`` the value is the history file's name and the sha256 of its
    content (in ``directory``), so an entry pointed at another model's history no longer matches."""
    value = entry.get(field)
    if field == "history" and value is not None:
        path = Path(directory or CHECKPOINT_DIR) / str(value)
        value = _history_value(value, path if path.is_file() else None)
    if field == "config":  # computed here from the kind and the configuration: an edited config_sha256 is not read
        value = config_sha256(str(entry.get("model")), value if isinstance(value, dict) else {})
    return _bound_hash(entry.get("sha256"), field, value)


def _history_value(name: str, path: Path | None) -> dict[str, Any]:
    """What ``bound_sha256["history"]`` hashes: the history file's name and its content's sha256."""
    return {"file": name, "sha256": sha256_file(path) if path is not None else None}


def _bound_hash(weights: str | None, field: str, value: Any) -> str:
    text = json.dumps({"weights": weights, "field": field, "value": value}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _check_bound(name: str, entry: dict[str, Any], directory: Path) -> None:
    """One :class:`EntryMismatchError` naming the field when an entry's bound fields differ from those exported."""
    fix = "restore registry.json (and the files it names) from the repository, or re-export the run"
    missing = [k for k in ("file", "sha256", "model", "config", "config_sha256") if k not in entry]
    if missing:
        raise ValueError(
            f"registry entry {name!r} has no {', '.join(missing)}; it was not written by export_checkpoint "
            f"(re-export the run with capsule_lib.train.shipped.export_run, or restore registry.json)"
        )
    bound = entry.get("bound_sha256")
    if not isinstance(bound, dict):
        raise EntryMismatchError(
            f"registry entry {name!r} in {directory} has no bound_sha256 (it was not written by export_checkpoint); "
            f"{fix}"
        )
    if "config" not in bound:
        raise EntryMismatchError(
            f"registry entry {name!r} in {directory}: its configuration is not bound to its weights (exported before "
            f"#64); re-export the run (export_run), or restore registry.json from the repository"
        )
    changed = [f for f in BOUND_FIELDS if bound.get(f) != bound_sha256(entry, f, directory)]
    if changed == list(BOUND_FIELDS):
        raise EntryMismatchError(
            f"registry entry {name!r}: its weights (file {entry.get('file')!r} and sha256) are not those its other "
            f"fields were exported with (every bound field differs); {fix}"
        )
    if changed:
        also = " (or the file it names changed)" if changed[0] == "history" else ""
        raise EntryMismatchError(
            f"registry entry {name!r}: its field {changed[0]!r}{also} differs from what was exported with its "
            f"weights; {fix}"
        )


def config_sha256(kind: str, config: dict[str, Any]) -> str:
    """sha256 of a registry entry's model ``kind`` and ``config`` as canonical JSON (sorted keys): what
    ``config_sha256`` in the registry records at export and :func:`load_pretrained` checks."""
    text = json.dumps({"model": kind, "config": config}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(name: str, directory: Path) -> dict[str, Any]:
    reg = registry(directory)
    if name not in reg:
        raise KeyError(f"no shipped checkpoint named {name!r}; available: {sorted(reg) or 'none'}")
    return reg[name]  # checked by registry(): every field it needs, the bound fields unchanged


def load_pretrained(
    name: str,
    map_location: str | torch.device = "cpu",
    directory: str | os.PathLike | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Build the model of a shipped checkpoint and load its weights (as float32), after checking sha256.

    Returns ``(model in eval mode, registry entry)``.
    """
    if not isinstance(map_location, (str, torch.device)):  # else torch's own error blames the file or Module.to
        raise ValueError(
            f"load_pretrained({name!r}): map_location must be a device name ('cpu', 'cuda', 'cuda:0') or a "
            f"torch.device, got {type(map_location).__name__}"
        )
    check_device(map_location, f"load_pretrained({name!r})", "map_location")
    d = Path(directory or CHECKPOINT_DIR)
    entry = _entry(name, d)
    path = d / entry["file"]
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint file {path} for {name!r} is missing (is the repository complete? "
            f"git-lfs is not used; the file should be in the repo)"
        )
    got = sha256_file(path)
    if got != entry["sha256"]:
        raise ChecksumMismatchError(
            f"checkpoint {name!r} ({path}): sha256 mismatch: registry says {entry['sha256']}, "
            f"file has {got}. The file is corrupted or was replaced; restore it from the "
            f"repository or re-export it with capsule_lib.train.shipped.export_checkpoint."
        )
    if config_sha256(entry["model"], entry["config"]) != entry["config_sha256"]:
        raise ChecksumMismatchError(
            f"checkpoint {name!r}: its registry entry's model configuration was changed after export (config_sha256 "
            f"mismatch); the weights were trained with the exported one. Restore registry.json from the repository"
        )
    model = build_model(entry["model"], entry["config"])
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise ValueError(
            f"checkpoint {name!r} ({path}): not a readable PyTorch state_dict ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:120] if str(e) else ''}); restore it from the repository"
        ) from None
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except (RuntimeError, AttributeError) as e:  # another model's weights: torch lists every key and shape
        first = str(e).splitlines()[1].strip()[:100] if len(str(e).splitlines()) > 1 else type(e).__name__
        raise ValueError(
            f"checkpoint {name!r} ({path}): its weights do not fit its registry entry's model {entry['model']!r} "
            f"({first}); the entry points at another model's file: restore registry.json from the repository"
        ) from None
    return model.to(map_location).eval(), entry


def load_pretrained_history(name: str, directory: str | os.PathLike | None = None) -> History:
    """The training history shipped with a checkpoint."""
    d = Path(directory or CHECKPOINT_DIR)
    entry = _entry(name, d)
    if not entry.get("history"):
        raise FileNotFoundError(f"shipped checkpoint {name!r} has no training history (its registry entry names none)")
    fix = f"restore it from the repository (git checkout -- {entry['history']} in {d})"
    return History.from_dict(read_json(d / entry["history"], fix))


@checked
def shipped_recipe(checkpoint: str, **overrides: Any) -> Recipe:
    """The recipe a shipped checkpoint's run started with, with ``overrides`` applied:
    ``train(shipped_recipe("capsnet_mnist"), out_dir=...)`` retrains it. Where the run was resumed with a
    changed recipe, ``phase=k`` (an override) picks the recipe of the k-th recorded change instead
    (``history.meta["changes"]``, whose ``from_epoch`` says when it applied)."""
    meta = load_pretrained_history(checkpoint).meta
    phase = overrides.pop("phase", 0)
    changes = meta.get("changes") or []
    if not 0 <= phase <= len(changes):
        raise ValueError(f"{checkpoint}: phase must be 0..{len(changes)} (its run recorded {len(changes)} change(s))")
    config = meta["config"] if phase == 0 else changes[phase - 1]["config"]
    return make_recipe(recipe_config(meta["recipe"], config), **overrides)


def export_checkpoint(
    model: nn.Module,
    name: str,
    kind: str,
    config: Any,
    *,
    metrics: dict[str, Any],
    training: dict[str, Any],
    history: History | dict | None = None,
    notes: str = "",
    half: bool = True,
    directory: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write ``<name>.pt`` (fp16 weights by default), ``<name>.history.json`` and the registry entry (its
    ``bound_sha256``: :func:`bound_sha256` of every field in :data:`BOUND_FIELDS`).

    All three are written to temporary files first and renamed only when every one of them is complete, so a full
    disk or a read-only folder leaves the registry and its files as they were (one
    :class:`~capsule_lib.train.checkpoint.CheckpointWriteError` naming the file). Weights holding NaN or inf are
    refused (``ValueError``): a non-finite model is never shipped."""
    state = {
        k: (v.detach().half() if half and v.is_floating_point() else v.detach()).cpu().contiguous()
        for k, v in model.state_dict().items()
    }
    bad = next((k for k, v in state.items() if v.is_floating_point() and not bool(v.isfinite().all())), None)
    if bad is not None:
        raise ValueError(
            f"export_checkpoint({name!r}): the weight {bad!r} holds nan or inf{' in float16' if half else ''}; a "
            f"non-finite model is never exported (train again with a lower learning rate{', or half=False' * half})"
        )
    d = Path(directory or CHECKPOINT_DIR)
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CheckpointWriteError(f"{d}: cannot create this folder ({e.strerror or type(e).__name__})") from None
    reg = registry(d)  # an existing entry that was edited stops the export here, before anything is written
    finals = [d / f"{name}.pt", *([d / f"{name}.history.json"] if history is not None else []), d / "registry.json"]
    staged = [f.with_name(f.name + ".tmp") for f in finals]  # written first, renamed when all are complete
    try:
        torch.save(state, staged[0])
        entry: dict[str, Any] = {
            "file": finals[0].name,
            "sha256": sha256_file(staged[0]),
            "model": kind,
            "config": json.loads(json.dumps(asdict(config) if is_dataclass(config) else dict(config), default=str)),
            "dtype": "float16" if half else "float32",
            "metrics": metrics,
            "training": training,
            "notes": notes,
        }
        entry["config_sha256"] = config_sha256(kind, entry["config"])
        entry = json.loads(json.dumps(entry, default=str))
        bound = {f: bound_sha256(entry, f, d) for f in BOUND_FIELDS}  # history: bound to its file below
        if history is not None:
            hist = history.to_dict() if isinstance(history, History) else history
            staged[1].write_text(json.dumps(hist, indent=1))
            entry["history"] = finals[1].name
            bound["history"] = _bound_hash(entry["sha256"], "history", _history_value(finals[1].name, staged[1]))
        entry["bound_sha256"] = bound
        reg[name] = entry
        staged[-1].write_text(json.dumps(reg, indent=1, sort_keys=True))
        for tmp, final in zip(staged, finals):
            os.replace(tmp, final)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError ("unexpected pos ...")
        for tmp in staged:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(f"{d}: cannot write the checkpoint {name!r} ({_short(e)}); {_WRITE_FIX}") from None
    return reg[name]


@checked
def evaluation_metrics(
    model: nn.Module, sets: dict[str, Any], *, batch_size: int = 256, device: str = "cpu"
) -> dict[str, Any]:
    """What an export records of ``model`` on each evaluation set (``{split: ImageDataset}``, e.g. a recipe's
    :meth:`~capsule_lib.train.recipes.base.Recipe.evaluation_sets`): ``<split>_acc``, ``<split>_errors`` and
    ``<split>_size``; on two-digit images (MultiMNIST, labels ``[N, 2]``) an image is right when both digits are among
    the top two scores (Sabour et al.'s metric), and ``<split>_per_digit`` adds the share of digits found
    (Efficient-CapsNet's). The same counts on another machine are the check that a checkpoint travelled intact."""
    from ..evaluation import multimnist_accuracy, predict

    if batch_size < 1:
        raise ValueError(f"evaluation_metrics: batch_size must be >= 1, got {batch_size}")
    bad = next((k for k, ds in sets.items() if not (hasattr(ds, "images") and hasattr(ds, "labels"))), None)
    if bad is not None:
        raise ValueError(f"evaluation_metrics: sets[{bad!r}] must be a dataset with images and labels (ImageDataset)")
    metrics: dict[str, Any] = {}
    for split, ds in sets.items():
        scores = predict(model, ds.images, batch_size=batch_size, device=device)["scores"]
        if ds.labels.dim() == 2:  # two digits per image (MultiMNIST): right when both are among the top two scores
            both = multimnist_accuracy(scores, ds.labels)
            right = round(both["both_correct"] * len(ds))
            metrics[f"{split}_per_digit"] = both["per_digit"]
        else:
            right = int((scores.argmax(1) == ds.labels).sum())
        metrics[f"{split}_acc"] = right / len(ds)
        metrics[f"{split}_errors"] = len(ds) - right
        metrics[f"{split}_size"] = len(ds)
    return metrics


def export_run(
    run_dir: str | os.PathLike,
    name: str,
    *,
    data_root: DataSource | str | None = None,
    notes: str = "",
    directory: str | os.PathLike | None = None,
    device: str = "cpu",
    max_epoch: int | None = None,
    batch_size: int = 256,
    eval_subset: int | None = None,
) -> dict[str, Any]:
    """Export the best-validation weights of a :class:`~capsule_lib.train.trainer.Trainer` run directory.

    The model is rebuilt from the run's ``history.json`` metadata, its weights are rounded to fp16 (what is
    shipped), and the **rounded** model is evaluated on the recipe's evaluation sets
    (:meth:`~capsule_lib.train.recipes.base.Recipe.evaluation_sets`: the validation and test splits of the run's
    dataset, or e.g. the familiar and novel test views of a viewpoint protocol),
    so the registry's metrics are those of the file readers load (``data_root``: a data root or a
    :class:`~capsule_lib.data.DataSource`, e.g. an offline one in tests). ``max_epoch`` limits the budget: the best
    validation epoch among the first ``max_epoch`` is exported (needs the run's ``epoch_NNN.pt`` snapshots
    unless that epoch is the run's ``best.pt``); the history is cut there too. ``batch_size``: of the evaluation
    (a smaller one for models whose activations are large, e.g. the paper-size Tsai network). ``eval_subset``: only
    the first N images of each evaluation set (a smoke run's export; the registry records the sizes).
    """
    run = Path(run_dir)
    hist = load_history(run / "history.json")
    meta = hist.meta
    kind = RECIPES[meta["recipe"]].model_kind
    config = dict(meta["config"]["model"])
    if config.get("primary_conv") == "bf16_gemm":  # a training-speed option; readers run the standard conv
        config["primary_conv"] = "standard"
    model = build_model(kind, config)
    best = _load_checkpoint(run / "best.pt", "cpu")
    if max_epoch is not None:
        hist = History([r for r in hist.records if r["epoch"] <= max_epoch], hist.meta)
        want = hist.best("val_acc")["epoch"]
        if best["epoch"] != want and want != int(want):
            raise ValueError(
                f"{run}: the best validation point among the first {max_epoch} epochs is the partial epoch {want}, "
                f"whose weights were kept only while it was the run's best; export without max_epoch"
            )
        if best["epoch"] != want:
            best = _load_checkpoint(run / f"epoch_{want:03d}.pt", "cpu")
    model.load_state_dict({k: v.half().float() if v.is_floating_point() else v for k, v in best["model"].items()})
    model.to(device).eval()
    metrics: dict[str, Any] = {"selected_epoch": best["epoch"], "selected_by": "val_acc"}
    sets = recipe_config(meta["recipe"], meta["config"]).evaluation_sets(data_root)  # e.g. val, test
    sets = {split: ds.subset(eval_subset) if eval_subset else ds for split, ds in sets.items()}
    metrics.update(evaluation_metrics(model, sets, batch_size=batch_size, device=device))
    recs = hist.records
    training = {
        "epochs": recs[-1]["epoch"] if recs else 0,  # a fraction when a budget stopped the run inside an epoch
        "wall_time_s": recs[-1]["wall_time"] if recs else None,
        "hardware": meta.get("hardware"),
        "device": meta.get("device"),
        "seed": meta.get("seed"),
        "torch": meta.get("torch"),
        "train_images": meta.get("train_images"),
        "dataset": meta.get("dataset"),
        "recipe": meta["config"],
    }
    for key in ("budget_minutes", "start_from", "epochs_fitted", "ema", "compile", "matmul_precision"):
        if meta.get(key) is not None:
            training[key] = meta[key]
    return export_checkpoint(
        model, name, kind, config, metrics=metrics, training=training, history=hist, notes=notes, directory=directory
    )
