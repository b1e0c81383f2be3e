"""What every chapter notebook does in its first cells, in one place.

A chapter starts with three cells::

    # 1. Colab only: install the library (a no-op anywhere else; see book/appendix/running.md)
    # 2. papermill "parameters" cell, plain literals only:
    SMOKE = False; TRAIN = False; EPOCHS = 15; DEVICE = "auto"; DATA_ROOT = ""
    # 3. effective settings
    from capsule_lib.notebook import settings
    cfg = settings(SMOKE, TRAIN, EPOCHS, DEVICE, DATA_ROOT)

:func:`settings` reads the environment (``CAPSULE_SMOKE``, ``CAPSULE_DATA``, ``CAPSULE_OFFLINE``; it never
writes it), picks the device, seeds every generator, sets the figure style and prints one banner line, so a
reader can see from the output how the numbers below it were produced. :func:`chapter_dataset` loads a
dataset the way every chapter should: the real data when it is there (or downloadable), otherwise the
generated stand-in, which says so loudly (a chapter never stops for missing data).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .data.datasets import data_root, is_offline, repository_root

__all__ = ["Settings", "settings", "env_flag", "in_colab", "chapter_dataset", "chapter_device", "display_path"]

_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to ``1``/``true``/``yes``/``on``."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def in_colab() -> bool:
    """True inside Google Colab (the ``google.colab`` module is importable only there)."""
    return "google.colab" in sys.modules


def display_path(path: str | os.PathLike) -> str:
    """How a chapter prints a folder without printing the machine's absolute path: ``$CAPSULE_DATA`` when it is
    that folder, a path relative to the repository when inside it, else ``.../<name>``."""
    p = Path(path).expanduser().resolve()
    env = os.environ.get("CAPSULE_DATA")
    if env and Path(env).expanduser().resolve() == p:
        return "$CAPSULE_DATA"
    repo = repository_root()
    if repo is not None:
        try:
            return p.relative_to(repo).as_posix() + "/"
        except ValueError:
            pass
    return f".../{p.name}/"


@dataclass(frozen=True)
class Settings:
    """Effective settings of a chapter run (see :func:`settings`)."""

    smoke: bool
    train: bool
    epochs: int
    device: torch.device
    data_root: Path
    offline: bool
    seed: int

    def banner(self) -> str:
        """One line: mode, training, device, data root (and offline mode), seed."""
        mode = "SMOKE run" if self.smoke else "full run"
        train = f"TRAIN on ({self.epochs} epoch{'s' if self.epochs != 1 else ''})" if self.train else "TRAIN off"
        offline = " (offline: stand-ins for missing data)" if self.offline else ""
        return (
            f"capsule_lib: {mode} | {train} | device {self.device} | data {display_path(self.data_root)}{offline} "
            f"| seed {self.seed}"
        )


def settings(
    SMOKE: bool = False,
    TRAIN: bool = False,
    EPOCHS: int = 1,
    DEVICE: str = "auto",
    DATA_ROOT: str = "",
    *,
    seed: int = 0,
    smoke_epochs: int = 1,
    style: bool = True,
    quiet: bool = False,
) -> Settings:
    """Turn a chapter's parameters into effective settings and apply them.

    * ``SMOKE`` is switched on by ``CAPSULE_SMOKE=1`` too (that is how ``make test`` runs nbval); in smoke
      mode ``EPOCHS`` is capped at ``smoke_epochs``.
    * ``DATA_ROOT``: ``""`` resolves as :func:`~capsule_lib.data.data_root` does (``$CAPSULE_DATA``, else the
      repository's ``data/``, else ``./data``). The chapter passes
      ``cfg.data_root`` to every dataset and recipe call; the environment is not modified.
    * ``CAPSULE_OFFLINE=1``: no downloads; missing datasets are replaced by generated stand-ins.
    * ``DEVICE``: ``"auto"`` (cuda, then mps, then cpu) or any ``torch.device`` string; a device that is not
      available here falls back to the CPU with one printed line (:func:`chapter_device`).

    Seeds Python, NumPy and torch with ``seed``, sets the book's matplotlib style (``style=False`` keeps
    yours) and prints :meth:`Settings.banner` unless ``quiet``.
    """
    from .training import seed_everything

    smoke = bool(SMOKE) or env_flag("CAPSULE_SMOKE")
    epochs = int(EPOCHS)
    if epochs < 1:
        raise ValueError(f"EPOCHS must be >= 1, got {EPOCHS!r}")
    if smoke:
        epochs = min(epochs, smoke_epochs)
    root = data_root(DATA_ROOT or None).resolve()
    cfg = Settings(
        smoke=smoke,
        train=bool(TRAIN),
        epochs=epochs,
        device=chapter_device(DEVICE),
        data_root=root,
        offline=is_offline(),
        seed=int(seed),
    )
    seed_everything(cfg.seed)
    if style:
        from .viz.plots import set_style

        set_style()
    if not quiet:
        print(cfg.banner())
    return cfg


def chapter_device(preference: str | torch.device | None = "auto") -> torch.device:
    """The device a chapter runs on: ``"auto"`` as :func:`~capsule_lib.training.select_device`; an explicit
    ``"cuda"``/``"mps"`` that this machine does not have falls back to the CPU with one printed line (a
    notebook written for Colab's GPU still runs on a laptop)."""
    from .training import select_device

    dev = select_device(preference or "auto")
    ok = {
        "cuda": torch.cuda.is_available,
        "mps": lambda: getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available(),
    }
    if dev.type in ok and not ok[dev.type]():
        print(f"DEVICE={str(preference)!r} requested but {dev.type} is not available here: running on the CPU instead.")
        return torch.device("cpu")
    return dev


def chapter_dataset(name: str, split: str, cfg: Settings, *, n_smoke: int = 512, **kwargs: Any):
    """Load ``name``/``split`` for a chapter: :func:`~capsule_lib.data.get_dataset` with ``cfg.data_root`` and
    ``standin=True``.

    Real data is used whenever it is present (or downloadable); otherwise the generated stand-in registered in
    :data:`~capsule_lib.data.datasets.STANDINS` is loaded and a line starting with ``[GENERATED stand-in data]`` is
    printed (datasets without a stand-in raise the clear
    :class:`~capsule_lib.data.DatasetUnavailableError`). In smoke mode at most ``n_smoke`` samples are kept.
    Prints the dataset's one-line banner and returns the :class:`~capsule_lib.data.ImageDataset`.
    """
    from .data import get_dataset

    if cfg.smoke:
        kwargs.setdefault("n", n_smoke)  # generated sets: make only what is kept (real loaders ignore ``n``)
    ds = get_dataset(name, cfg.data_root, split, standin=True, **kwargs)
    if cfg.smoke and len(ds) > n_smoke:
        ds = ds.subset(n_smoke)
    print(ds.banner())
    if ds.standin_for:
        print(
            f"[GENERATED stand-in data] The text of this page describes the results on the real {ds.standin_for}; "
            f"the numbers and figures below are computed on the stand-in and differ from them."
        )
    return ds
