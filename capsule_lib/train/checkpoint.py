"""What a run leaves on disk: its per-epoch :class:`History` (``history.json``) and the checkpoint files
(``last.pt``, ``best.pt``), written atomically and read with a one-line error when corrupt.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["History", "load_history", "read_json", "RunMismatchError"]


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
        p = Path(path)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1))
        os.replace(tmp, p)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> History:
        return cls(list(d.get("records", [])), dict(d.get("meta", {})))


def read_json(path: str | os.PathLike, fix: str) -> Any:
    """``path``'s JSON, or a one-line ``ValueError`` that names the file and says what to do (``fix``) when it is not
    valid JSON (cut short by a full disk, or edited by hand)."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{path}: not valid JSON (truncated or edited? {e.msg} at line {e.lineno}, column {e.colno}); {fix}"
        ) from None


def load_history(path: str | os.PathLike) -> History:
    """The :class:`History` in ``path`` (a run's ``history.json``)."""
    fix = "restore it, or, in a run folder, delete it and run the same training again (it is written anew from last.pt)"
    return History.from_dict(read_json(path, fix))


# -------------------------------------------------------------------------------------------- trainer
def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


class RunMismatchError(ValueError):
    """``out_dir/last.pt`` belongs to another run than the one being trained."""


def _load_checkpoint(path: Path, device: torch.device | str) -> Any:
    """``torch.load`` with a one-line, actionable error for a truncated or corrupt run checkpoint."""
    try:
        return torch.load(path, map_location=device, weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError) as e:
        raise RuntimeError(
            f"{path}: cannot read this checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:120]}); "
            f"it is truncated or corrupt. Delete it (or the run folder) to start the run afresh"
        ) from e
