"""The shipped checkpoints, for their readers: :func:`load_pretrained` (a model with its weights, sha256-checked),
:func:`load_pretrained_history`, :func:`registry`, :func:`export_run`; :func:`load_trained` (a model from a run
folder, a checkpoint file or a shipped name, with its class names); and :func:`load_heinsen_2019` (the author's
published state_dicts).

The registry, the sha256 checks, the export of a run and the reading back that training needs live in
:mod:`capsule_lib.train.shipped` (exporting a run is training's job, and ``train(start_from=...)`` and
:func:`~capsule_lib.train.shipped.shipped_recipe` read shipped checkpoints); this module re-exports them and sits
above all of ``train/``: ``pretrained`` imports ``train``, never the reverse (``tests/test_architecture.py``).
``python -m capsule_lib.pretrained RUN_DIR NAME`` exports a run (as ``python -m capsule_lib.train ... --export``).
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._contracts import checked
from .models.registry import build_model
from .train.checkpoint import check_run, load_history
from .train.recipes import RECIPES
from .train.shipped import (
    CHECKPOINT_DIR,
    ChecksumMismatchError,
    config_sha256,
    export_checkpoint,
    export_run,
    load_pretrained,
    load_pretrained_history,
    registry,
    sha256_file,
)

__all__ = [  # for a reader first (the module docstring's order), then the re-exported rest of train.shipped
    "load_pretrained",
    "load_trained",
    "load_pretrained_history",
    "registry",
    "export_run",
    "load_heinsen_2019",
    "HEINSEN_2019_FILE",
    "build_model",
    "CHECKPOINT_DIR",
    "ChecksumMismatchError",
    "config_sha256",
    "export_checkpoint",
    "sha256_file",
]


# ------------------------------------------------------------------ a trained model, wherever it was written
@checked
def load_trained(
    run_or_checkpoint: str | os.PathLike, map_location: str | torch.device = "cpu"
) -> tuple[nn.Module, dict[str, Any]]:
    """A trained model in eval mode and what its run recorded, from any of: a run folder of
    :func:`~capsule_lib.train.train` (``history.json`` and ``best.pt``: the weights chosen on validation), an exported
    checkpoint file ``<name>.pt`` (with the ``registry.json`` of its folder, sha256-checked), or the name of a shipped
    checkpoint (:func:`load_pretrained`). What ``python -m capsule_lib.predict`` loads.

    Parameters
    ----------
    run_or_checkpoint : str or os.PathLike
        A run folder, a ``.pt`` file, or a shipped checkpoint's name.
    map_location : str or torch.device
        Where the model's weights go.

    Returns
    -------
    tuple
        ``(model, info)``: ``info["classes"]`` the class names in score order (the run's record; ``"0" ... "K-1"``
        for a run that recorded none), ``info["meta"]`` the run's ``history.meta``, ``info["kind"]`` the model kind,
        ``info["source"]`` what was read. A run that did not learn (its ``meta["learned"]`` is false:
        :mod:`capsule_lib.train.learning_check`) is loaded with one warning line on stderr.
    """
    path = Path(run_or_checkpoint).expanduser()
    if path.is_dir():
        if not (path / "history.json").is_file() or not (path / "best.pt").is_file():
            raise FileNotFoundError(
                f"{path}: not a finished run folder (it needs history.json and best.pt, which train() writes)"
            )
        check_run(path, ("best.pt", "history.json"))  # the weights and the names are this run's (run.json)
        meta = load_history(path / "history.json").meta
        kind = RECIPES[meta["recipe"]].model_kind
        model = build_model(kind, meta["config"]["model"])
        try:
            best = torch.load(path / "best.pt", map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
            why = type(e).__name__
            raise ValueError(f"{path / 'best.pt'}: not a readable checkpoint ({why}); train the run again") from None
        try:
            model.load_state_dict(best["model"])
        except (RuntimeError, KeyError, TypeError) as e:  # torch lists every key and shape: one line instead
            raise ValueError(
                f"{path / 'best.pt'}: its weights do not fit the network history.json describes ({type(e).__name__}); "
                f"train the run again"
            ) from None
        model = model.to(map_location).eval()
        source = f"run {path} (epoch {best['epoch']})"
    elif path.suffix == ".pt" and path.is_file():
        model, entry = load_pretrained(path.stem, map_location, directory=path.parent)
        meta, kind, source = load_pretrained_history(path.stem, path.parent).meta, entry["model"], f"checkpoint {path}"
    elif not path.suffix and str(run_or_checkpoint) in registry():
        model, entry = load_pretrained(str(run_or_checkpoint), map_location)
        meta, kind = load_pretrained_history(str(run_or_checkpoint)).meta, entry["model"]
        source = f"shipped checkpoint {run_or_checkpoint}"
    else:
        raise FileNotFoundError(
            f"{run_or_checkpoint}: not a run folder, a checkpoint file (.pt) or a shipped checkpoint "
            f"(shipped: {', '.join(sorted(registry())[:4])}, ...)"
        )
    if meta.get("learned") is False:  # the run's own verdict (capsule_lib.train.learning_check), said once here
        why = (meta.get("learning_check") or {}).get("reason", "")
        print(f"warning: {source} did not learn; its predictions are no better than chance ({why})", file=sys.stderr)
    n = model.config.n_classes if hasattr(getattr(model, "config", None), "n_classes") else None
    classes = meta.get("classes") or (meta.get("images") or {}).get("classes") or [str(k) for k in range(n or 0)]
    if n is not None and len(classes) != n:
        raise ValueError(f"{source}: its record names {len(classes)} classes for a network of {n}; train the run again")
    return model, {"classes": list(classes), "meta": meta, "kind": kind, "source": source}


# ------------------------------------------------------------------ the author's published Heinsen weights
#: where ``data_scripts/heinsen_weights.py`` puts the author's smallNORB state_dict, relative to the data root
HEINSEN_2019_FILE = "heinsen_2019/smallNORB_pretrained_model_state_dict.pt"


def _author_config(sd: dict[str, torch.Tensor]) -> tuple[str, dict[str, Any]]:
    """Which of the author's 2019 models a state_dict is, and its sizes (read off the tensors' shapes)."""
    if "convolve.1.weight" in sd and "compute_mu.1.weight" in sd and "routings.1.W" in sd:
        n_parts, d_chns = sd["compute_a.1.weight"].shape[:2]
        d_pose = math.isqrt(sd["compute_mu.1.weight"].shape[0] // n_parts)
        n_convs = sum(1 for k in sd if k.startswith("convolve.") and k.endswith(".weight") and sd[k].dim() == 4)
        return "smallnorb", {
            "n_objs": sd["routings.1.W"].shape[1],
            "n_parts": n_parts,
            "d_chns": d_chns,
            "in_channels": sd["convolve.1.weight"].shape[1] - 2,  # the model adds the 2 coordinate channels
            "d_pose": d_pose,
            "strides": (1, 2) * (n_convs // 2),
        }
    if "detect_parts.0.weight" in sd and "routings.1.W" in sd:
        d_inp, d_emb = sd["detect_parts.0.weight"].shape
        return "sst", {
            "d_depth": sd["depth_emb"].shape[0] if "depth_emb" in sd else None,
            "d_emb": d_emb,
            "d_inp": d_inp,
            "d_out": sd["routings.0.W"].shape[-1],
            "n_parts": sd["routings.0.W"].shape[1],
            "n_classes": sd["routings.1.W"].shape[1],
        }
    raise ValueError(
        "not one of Heinsen's (2019) published state_dicts: expected the keys of SmallNORBClassifier "
        "(convolve.*, compute_a.*, compute_mu.*, routings.*) or SSTClassifier (depth_emb, detect_parts.*, "
        f"routings.*); got {', '.join(list(sd)[:4])}{', ...' if len(sd) > 4 else ''}"
    )


@checked
def load_heinsen_2019(
    source: str | os.PathLike | dict[str, torch.Tensor],
    image_size: int | None = 96,
    map_location: str | torch.device = "cpu",
) -> nn.Module:
    """The author's published Heinsen (2019) weights as a ``capsule_lib`` model (eval mode).

    ``source``: the path of a state_dict file saved by the author's code (``data_scripts/heinsen_weights.py``
    fetches the smallNORB one into ``<data root>/`` :data:`HEINSEN_2019_FILE`), or the state_dict itself.
    The model is :class:`~capsule_lib.models.SmallNORBClassifier` for the smallNORB file (``image_size``:
    the input size to check, 96 as published, ``None`` for any) and
    :class:`~capsule_lib.models.SequenceClassifierHead` for the SST files, with the sizes read off the
    tensors' shapes. The author's key names and layouts are ours (``convolve.{0,1,3,4,...}`` = BatchNorm and
    Conv of each block, the Swish modules having no state; ``routings.{0,1}.{W,B,beta_use,beta_ign,
    CONST_one}``); a ``module.`` prefix (``DataParallel``) is removed. Every tensor must be used and every
    parameter and buffer filled: a missing, unexpected or mis-shaped key raises a one-line ``ValueError``
    naming it."""
    from .models.heinsen import SequenceClassifierConfig, SequenceClassifierHead, SmallNORBClassifier, SmallNORBConfig

    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(
                f"source {str(path)!r}: no such file; fetch the author's weights with "
                f"python data_scripts/heinsen_weights.py --root <data root>"
            )
        try:
            sd = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
            raise ValueError(f"{path}: not a readable PyTorch state_dict ({type(e).__name__}: {e})") from None
    else:
        sd = source
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise ValueError(f"expected a state_dict (a dict of tensors), got {type(sd).__name__}")
    sd = {k.removeprefix("module."): v for k, v in sd.items()}
    kind, sizes = _author_config(sd)
    if kind == "smallnorb":
        model: nn.Module = SmallNORBClassifier(SmallNORBConfig(image_size=image_size, **sizes))
    else:
        model = SequenceClassifierHead(SequenceClassifierConfig(**sizes))
    ours = model.state_dict()
    missing = [k for k in ours if k not in sd]
    unexpected = [k for k in sd if k not in ours]
    if missing or unexpected:
        what = f"missing key {missing[0]!r}" if missing else f"unexpected key {unexpected[0]!r}"
        more = len(missing) + len(unexpected) - 1
        raise ValueError(
            f"author's {kind} state_dict: {what}{f' (and {more} more)' if more else ''}; "
            f"it does not match {type(model).__name__}"
        )
    for k, v in ours.items():
        if sd[k].shape != v.shape:
            raise ValueError(
                f"author's {kind} state_dict: {k!r} has shape {tuple(sd[k].shape)}, "
                f"{type(model).__name__} expects {tuple(v.shape)}"
            )
    model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in sd.items()})
    return model.to(map_location).eval()


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
