"""What a run leaves on disk: its per-epoch :class:`History` (``history.json``) and the checkpoint files
(``last.pt``, ``best.pt``, ``epoch_NNN.pt``), written atomically (a full disk or a read-only folder leaves no
``.tmp`` behind and fails in one line naming the file) and read with ``torch.load(weights_only=True)``: a run
checkpoint holds only tensors and plain Python values (numbers, strings, lists, tuples, dicts), so a run folder
someone shares cannot run code when it is loaded; one that holds anything else is refused in one line.

A run folder is one thing: ``run.json`` binds its parts by sha256, rewritten with each of them (:data:`RUN_FILE`):
the weights ``best.pt`` and ``last.pt`` (each file's bytes) and ``history.json``'s identity (:func:`run_identity`:
the recipe, the configuration, the classes, the data's decisions and the content fingerprint of the images, which
is also what the image cache holds). :func:`check_run` is called on every load (``predict``,
:func:`~capsule_lib.pretrained.load_trained`, a resume) and refuses a part that differs in one line naming it: a
``best.pt`` copied from another run, class names edited in ``history.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "History",
    "load_history",
    "read_json",
    "RunMismatchError",
    "UnsafeCheckpointError",
    "CheckpointReadError",
    "CheckpointWriteError",
    "RUN_FILE",
    "run_identity",
    "check_run",
]

#: the file of a run folder that binds its parts together (``{"format": 1, "parts": {"best.pt": sha256, ...}}``)
RUN_FILE = "run.json"
#: the parts :data:`RUN_FILE` binds: the two weight files, and the history's identity (:func:`run_identity`)
_WEIGHTS = ("best.pt", "last.pt")
#: what a run's identity holds of ``history.meta`` (the records, timings and the test result are what happened)
_IDENTITY_KEYS = (
    "recipe",
    "config",
    "dataset",
    "classes",
    "images",
    "data_fingerprint",
    "train_images",
    "generated_data",
    "start_from",
    "ema",
)


# -------------------------------------------------------------------------------------------- history
@dataclass
class History:
    """Per-epoch records (dicts with ``epoch``, ``train_loss``, ``train_acc``, ``val_loss``, ``val_acc``,
    optional ``test_acc``, loss parts, ``lr``, ``epoch_time``, ``wall_time``) plus run metadata."""

    records: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def append(self, rec: dict[str, Any]) -> None:
        self.records.append(rec)

    def __len__(self) -> int:
        return len(self.records)

    def column(self, key: str) -> list[Any]:
        return [r.get(key) for r in self.records]

    def best(self, key: str = "val_acc") -> dict[str, Any] | None:
        recs = [r for r in self.records if r.get(key) is not None]
        return max(recs, key=lambda r: r[key]) if recs else None

    def time_to(self, thresholds: tuple[float, ...], key: str = "val_acc") -> dict[str, float | None]:
        """For each threshold, the training wall time (s) of the first record whose ``key`` reached it (``None``:
        never), keyed by the threshold as text: ``{"0.997": 181.4, ...}``."""
        out: dict[str, float | None] = {}
        for t in thresholds:
            hit = next((r for r in self.records if r.get(key) is not None and r[key] >= t), None)
            out[f"{t:g}"] = round(hit["wall_time"], 2) if hit is not None else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "records": self.records}

    def save(self, path: str | os.PathLike) -> None:
        """Write the history to ``path``; a run's ``history.json`` also binds its identity in the folder's
        :data:`RUN_FILE`."""
        path = Path(path)
        _atomic_write_text(path, json.dumps(self.to_dict(), indent=1))
        if path.name == "history.json":
            _bind(path.parent, "history.json", run_identity(self.meta))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        return cls(list(d.get("records", [])), dict(d.get("meta", {})))


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """``path``'s JSON, or a one-line error that names the file and says what to do (``fix``): a ``ValueError`` when
    it is not valid JSON (cut short by a full disk, or edited by hand), a ``FileNotFoundError`` when it is missing."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file; {fix}") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: not valid JSON (truncated or edited? {e.msg} at line {e.lineno}, column {e.colno}); {fix}"
        ) from None


def run_identity(meta: dict[str, Any]) -> str:
    """sha256 of what makes a run's history this run's: the recipe, configuration, classes, the reader's images'
    decisions (not how they were read this time: ``stored``) and the data's content fingerprint, as canonical
    JSON."""
    ident = {k: meta.get(k) for k in _IDENTITY_KEYS}
    if isinstance(ident["images"], dict):
        ident["images"] = {k: v for k, v in ident["images"].items() if k != "stored"}
    text = json.dumps(ident, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _read_run_file(folder: Path) -> dict[str, str] | None:
    try:
        data = json.loads((folder / RUN_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    parts = data.get("parts") if isinstance(data, dict) else None
    return dict(parts) if isinstance(parts, dict) else None


def _bind(folder: Path, part: str, digest: str) -> None:
    """Record ``part``'s sha256 in the folder's :data:`RUN_FILE` (written atomically, with the part)."""
    parts = _read_run_file(folder) or {}
    parts[part] = digest
    text = json.dumps({"format": 1, "parts": dict(sorted(parts.items()))}, indent=1)
    _atomic_write_text(folder / RUN_FILE, text)


def check_run(folder: str | os.PathLike, parts: tuple[str, ...] = ("best.pt", "history.json")) -> None:
    """Refuse, in one :class:`RunMismatchError` naming it, a part of the run folder that is not the one its run
    wrote: ``best.pt`` or ``last.pt`` whose bytes differ from the sha256 in :data:`RUN_FILE`, or a ``history.json``
    whose identity (:func:`run_identity`: config, classes, decisions) does. A folder without :data:`RUN_FILE` (or
    without a part's entry) is refused too, unless every part is absent from the folder.

    Parameters
    ----------
    folder : str or os.PathLike
        The run folder.
    parts : tuple of str
        The parts about to be used (``"best.pt"``, ``"last.pt"``, ``"history.json"``).
    """
    folder = Path(folder)
    present = [p for p in parts if (folder / p).is_file()]
    if not present:
        return
    bound = _read_run_file(folder)
    fix = "restore it, or train the run again (a run folder's files are only used together)"
    if bound is None:
        raise RunMismatchError(
            f"{folder}: no readable {RUN_FILE} binding {', '.join(present)} together (a folder written before "
            f"#64, or assembled by hand); {fix}"
        )
    for part in present:
        if part == "history.json":
            got = run_identity(load_history(folder / part).meta)
            what = "history.json (its config, classes or data decisions)"
        else:
            got, what = _file_sha256(folder / part), part
        if bound.get(part) != got:
            raise RunMismatchError(
                f"{folder}: {what} is not the one this run wrote (edited, cut short or copied from another run: its "
                f"sha256 differs from {RUN_FILE}'s); {fix}"
            )


def load_history(path: str | os.PathLike) -> History:
    """The :class:`History` in ``path`` (a run's ``history.json``)."""
    fix = "restore it, or, in a run folder, delete it and run the same training again (it is written anew from last.pt)"
    return History.from_dict(read_json(path, fix))


# -------------------------------------------------------------------------------------------- trainer
class CheckpointWriteError(OSError):
    """A run file could not be written (a full disk, a read-only or vanished folder); nothing half-written is left."""


def _atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` through ``<path>.tmp`` and a rename: a crash, a full disk or a read-only folder never leaves a
    half-written ``path`` or a ``.tmp`` behind; such a failure is one :class:`CheckpointWriteError` naming the file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    try:
        torch.save(obj, tmp)
        digest = _file_sha256(tmp) if path.name in _WEIGHTS else None
        os.replace(tmp, path)
    except (OSError, RuntimeError) as e:  # torch reports a full disk as a RuntimeError ("unexpected pos ...")
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(f"{path}: cannot write this file ({_short(e)}); {_WRITE_FIX}") from None
    if digest is not None:  # a run's weights: bound in the folder's run.json
        _bind(path.parent, path.name, digest)


def _atomic_write_text(path: Path, text: str) -> None:
    """:func:`_atomic_save` for a text file (``history.json``, ``registry.json``)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise CheckpointWriteError(f"{path}: cannot write this file ({_short(e)}); {_WRITE_FIX}") from None


_WRITE_FIX = "free disk space, or choose a folder you can write to"


def _short(e: BaseException) -> str:
    """An exception as a short phrase: its type and the first line of its message."""
    text = str(e).splitlines()[0][:120] if str(e) else ""
    if isinstance(e, OSError) and e.strerror:
        text = e.strerror
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class RunMismatchError(ValueError):
    """``out_dir/last.pt`` belongs to another run than the one being trained."""


class CheckpointReadError(RuntimeError):
    """A run checkpoint cannot be read (truncated, corrupt): one line naming the file and what to do."""


class UnsafeCheckpointError(ValueError):
    """A checkpoint holds objects that loading would have to execute code for (``torch.load(weights_only=True)``
    refused it); it is never loaded."""


def _numpy_array_globals() -> list:
    """What a NumPy array needs to be unpickled (its class, dtype and reconstruction function, none of which runs code):
    allow-listed so that run checkpoints written before the RNG state was stored as a tensor still load."""
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    kinds = [np.ndarray, np.dtype, core.multiarray._reconstruct]
    kinds += [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64)]  # numpy 2's dtype classes
    return kinds


def _load_checkpoint(path: Path, device: torch.device | str) -> Any:
    """``torch.load(weights_only=True)`` (tensors, plain values and NumPy arrays only) with a one-line, actionable error
    for a truncated, corrupt or unsafe run checkpoint; a run's ``best.pt`` or ``last.pt`` is first checked against its
    folder's :data:`RUN_FILE` (a resume, :meth:`~capsule_lib.train.trainer.Trainer.load_best`, an export)."""
    state = _read_checkpoint(path, device)  # a truncated or unsafe file is said as such first
    if path.name in _WEIGHTS and (path.parent / RUN_FILE).exists():  # (a folder written before #64 has none)
        check_run(path.parent, (path.name, "history.json"))
    return state


def _read_checkpoint(path: Path, device: torch.device | str) -> Any:
    try:
        with warnings.catch_warnings(record=True) as said:  # torch's warnings: shown for a checkpoint that loads
            warnings.simplefilter("always")
            with torch.serialization.safe_globals(_numpy_array_globals()):
                state = torch.load(path, map_location=device, weights_only=True)
        for w in said:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return state
    except pickle.UnpicklingError:  # weights_only refused a global: loading would run code (or the file is foreign)
        try:
            with warnings.catch_warnings():  # the refusal is the one line said, without torch's warning lines
                warnings.simplefilter("ignore")
                found = ", ".join(torch.serialization.get_unsafe_globals_in_checkpoint(path)[:3])
        except Exception:  # noqa: BLE001 - naming what it holds is a courtesy; the refusal stands either way
            found = ""
        raise UnsafeCheckpointError(
            f"{path}: refused: it holds objects other than tensors and plain values ({found or 'a pickled object'}), "
            f"and loading them could run code. Use run folders written by capsule_lib; delete this one to start afresh"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise CheckpointReadError(
            f"{path}: cannot read this checkpoint ({_short(e)}); "
            f"it is truncated or corrupt. Delete it (or the run folder) to start the run afresh"
        ) from None
