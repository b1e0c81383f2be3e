"""Registry of the checkpoints shipped with the book: file + sha256 + metrics + how it was trained.

``capsule_lib/checkpoints/registry.json`` maps a name to an entry::

    {"file": "capsnet_mnist.pt", "sha256": "...", "model": "capsnet", "config": {...},
     "metrics": {"test_acc": 0.996, ...}, "training": {"epochs": 15, "hardware": "...", ...},
     "history": "capsnet_mnist.history.json", "notes": "..."}

:func:`load_pretrained` checks the file's sha256 before loading and refuses a mismatch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .training import History

__all__ = [
    "CHECKPOINT_DIR",
    "ChecksumMismatchError",
    "registry",
    "sha256_file",
    "load_pretrained",
    "export_run",
    "load_pretrained_history",
    "export_checkpoint",
    "build_model",
    "MODEL_BUILDERS",
]

CHECKPOINT_DIR = Path(__file__).resolve().parent / "checkpoints"


class ChecksumMismatchError(RuntimeError):
    """A shipped checkpoint's bytes do not match the sha256 in the registry."""


def _builders() -> dict[str, Callable[[dict[str, Any]], nn.Module]]:
    from .models.baselines import BaselineCNN, BaselineCNNConfig
    from .models.capsnet import CapsNet, CapsNetConfig
    from .models.em_capsnet import EMCapsNet, EMCapsNetConfig

    out: dict[str, Callable[[dict[str, Any]], nn.Module]] = {
        "capsnet": lambda c: CapsNet(_from_dict(CapsNetConfig, c)),
        "baseline_cnn": lambda c: BaselineCNN(_from_dict(BaselineCNNConfig, c)),
        "em_capsnet": lambda c: EMCapsNet(_from_dict(EMCapsNetConfig, c)),
    }
    try:
        from .models.efficient import EfficientCapsNet, EfficientCapsNetConfig

        out["efficient_capsnet"] = lambda c: EfficientCapsNet(_from_dict(EfficientCapsNetConfig, c))
    except ImportError:  # pragma: no cover - optional while the module is being written
        pass
    return out


MODEL_BUILDERS = _builders


def _from_dict(cls: type, d: dict[str, Any]) -> Any:
    names = {f.name: f for f in fields(cls)}
    kw = {}
    for k, v in d.items():
        if k in names:
            kw[k] = tuple(v) if isinstance(v, list) else v
    return cls(**kw)


def build_model(kind: str, config: dict[str, Any]) -> nn.Module:
    """Instantiate a model of ``kind`` from its config dict (unknown keys are ignored).

    Kinds: ``"capsnet"``, ``"baseline_cnn"``, ``"efficient_capsnet"``, ``"em_capsnet"``."""
    builders = _builders()
    if kind not in builders:
        raise ValueError(f"unknown model kind {kind!r}; known: {sorted(builders)}")
    return builders[kind](config)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def registry(directory: str | os.PathLike | None = None) -> dict[str, dict[str, Any]]:
    """The registry as a dict ``name -> entry`` (empty if none is shipped)."""
    p = Path(directory or CHECKPOINT_DIR) / "registry.json"
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{p}: the checkpoint registry is not valid JSON ({e}); restore it from the repository "
            f"(git checkout -- {p.name} in its folder) or re-export the checkpoints"
        ) from None


def _atomic_write(path: Path, data: bytes | str) -> None:
    """Write ``path`` through a temporary file and a rename, so a crash never leaves it half written."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def _entry(name: str, directory: Path) -> dict[str, Any]:
    reg = registry(directory)
    if name not in reg:
        raise KeyError(f"no shipped checkpoint named {name!r}; available: {sorted(reg) or 'none'}")
    return reg[name]


def load_pretrained(
    name: str,
    map_location: str | torch.device = "cpu",
    directory: str | os.PathLike | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """Build the model of a shipped checkpoint and load its weights (as float32), after checking sha256.

    Returns ``(model in eval mode, registry entry)``.
    """
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
            f"repository or re-export it with capsule_lib.pretrained.export_checkpoint."
        )
    model = build_model(entry["model"], entry.get("config", {}))
    state = torch.load(path, map_location=map_location, weights_only=True)
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    return model.to(map_location).eval(), entry


def load_pretrained_history(name: str, directory: str | os.PathLike | None = None) -> History:
    """The training history shipped with a checkpoint."""
    d = Path(directory or CHECKPOINT_DIR)
    entry = _entry(name, d)
    return History.from_dict(json.loads((d / entry["history"]).read_text()))


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
    """Write ``<name>.pt`` (fp16 weights by default), ``<name>.history.json`` and the registry entry."""
    d = Path(directory or CHECKPOINT_DIR)
    d.mkdir(parents=True, exist_ok=True)
    state = {
        k: (v.detach().half() if half and v.is_floating_point() else v.detach()).cpu().contiguous()
        for k, v in model.state_dict().items()
    }
    file = d / f"{name}.pt"
    tmp = file.with_name(file.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, file)
    entry: dict[str, Any] = {
        "file": file.name,
        "sha256": sha256_file(file),
        "model": kind,
        "config": asdict(config) if is_dataclass(config) else dict(config),
        "dtype": "float16" if half else "float32",
        "metrics": metrics,
        "training": training,
        "notes": notes,
    }
    if history is not None:
        hist = history.to_dict() if isinstance(history, History) else history
        _atomic_write(d / f"{name}.history.json", json.dumps(hist, indent=1))
        entry["history"] = f"{name}.history.json"
    reg = registry(d)
    reg[name] = json.loads(json.dumps(entry, default=str))
    _atomic_write(d / "registry.json", json.dumps(reg, indent=1, sort_keys=True))
    return reg[name]


def export_run(
    run_dir: str | os.PathLike,
    name: str,
    *,
    data_root: str | None = None,
    notes: str = "",
    directory: str | os.PathLike | None = None,
    device: str = "cpu",
    max_epoch: int | None = None,
) -> dict[str, Any]:
    """Export the best-validation weights of a :class:`~capsule_lib.training.Trainer` run directory.

    The model is rebuilt from the run's ``history.json`` metadata, its weights are rounded to fp16 (what is
    shipped), and the **rounded** model is evaluated on the recipe's evaluation sets
    (:meth:`~capsule_lib.recipes.Recipe.evaluation_sets`: the validation and test splits of the run's dataset,
    or e.g. the familiar and novel test views of a viewpoint protocol),
    so the registry's metrics are those of the file readers load. ``max_epoch`` limits the budget: the best
    validation epoch among the first ``max_epoch`` is exported (needs the run's ``epoch_NNN.pt`` snapshots
    unless that epoch is the run's ``best.pt``); the history is cut there too.
    """
    from .evaluation import accuracy, predict
    from .recipes import recipe_config

    run = Path(run_dir)
    hist = History.from_dict(json.loads((run / "history.json").read_text()))
    meta = hist.meta
    kind = {
        "capsnet": "capsnet",
        "efficient": "efficient_capsnet",
        "baseline_cnn": "baseline_cnn",
        "efficient_multimnist": "efficient_capsnet",
        "em_norb": "em_capsnet",
        "baseline_cnn_norb": "baseline_cnn",
    }[meta["recipe"]]
    config = dict(meta["config"]["model"])
    if config.get("primary_conv") == "bf16_gemm":  # a training-speed option; readers run the standard conv
        config["primary_conv"] = "standard"
    model = build_model(kind, config)
    best = torch.load(run / "best.pt", map_location="cpu", weights_only=False)
    if max_epoch is not None:
        hist = History([r for r in hist.records if r["epoch"] <= max_epoch], hist.meta)
        want = hist.best("val_acc")["epoch"]
        if best["epoch"] != want:
            best = torch.load(run / f"epoch_{want:03d}.pt", map_location="cpu", weights_only=False)
    model.load_state_dict({k: v.half().float() if v.is_floating_point() else v for k, v in best["model"].items()})
    model.to(device).eval()
    metrics: dict[str, Any] = {"selected_epoch": best["epoch"], "selected_by": "val_acc"}
    sets = recipe_config(meta["recipe"], meta["config"]).evaluation_sets(data_root)  # e.g. val, test
    for split, ds in sets.items():
        res = predict(model, ds.images, device=device)
        metrics[f"{split}_acc"] = accuracy(res["scores"], ds.labels)
        metrics[f"{split}_errors"] = int((res["scores"].argmax(1) != ds.labels).sum())
        metrics[f"{split}_size"] = len(ds)
    recs = hist.records
    training = {
        "epochs": len(recs),
        "wall_time_s": recs[-1]["wall_time"] if recs else None,
        "hardware": meta.get("hardware"),
        "device": meta.get("device"),
        "seed": meta.get("seed"),
        "torch": meta.get("torch"),
        "train_images": meta.get("train_images"),
        "dataset": meta.get("dataset"),
        "recipe": meta["config"],
    }
    return export_checkpoint(
        model, name, kind, config, metrics=metrics, training=training, history=hist, notes=notes, directory=directory
    )


def _main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="Export a training run as a shipped checkpoint (fp16 + registry entry).")
    p.add_argument("run_dir")
    p.add_argument("name")
    p.add_argument("--data-root", default=None)
    p.add_argument("--notes", default="")
    p.add_argument("--max-epoch", type=int, default=None, help="export the best epoch among the first N")
    a = p.parse_args(argv)
    entry = export_run(a.run_dir, a.name, data_root=a.data_root, notes=a.notes, max_epoch=a.max_epoch)
    print(json.dumps({k: entry[k] for k in ("file", "sha256", "metrics")}, indent=1))


if __name__ == "__main__":
    _main()
