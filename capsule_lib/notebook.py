"""What every chapter notebook does in its first cells, in one place.

A chapter starts with three cells::

    # 1. Colab only: install the library (a no-op anywhere else; see book/appendix/running.md)
    # 2. papermill "parameters" cell, plain literals only:
    SMOKE = False; TRAIN = False; EPOCHS = 15; DEVICE = "auto"; DATA_ROOT = ""
    # 3. effective settings
    from capsule_lib.notebook import settings
    cfg = settings(SMOKE, TRAIN, EPOCHS, DEVICE, DATA_ROOT)

:func:`settings` applies the environment (``CAPSULE_SMOKE``, ``CAPSULE_DATA``, ``CAPSULE_OFFLINE``), picks the
device, seeds every generator, sets the figure style and prints one banner line, so a reader can see from
the output how the numbers below it were produced. :func:`chapter_dataset` loads a dataset the way every
chapter should: the real data when it is there (or downloadable), otherwise, in smoke or offline mode, a
generated stand-in that says so loudly.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = ["Settings", "settings", "env_flag", "in_colab", "default_data_root", "chapter_dataset",
           "STANDINS"]

#: Generated stand-in used for each real dataset when the real one is unavailable (smoke/offline mode).
STANDINS: dict[str, str] = {"mnist": "glyph_digits", "fashion_mnist": "glyph_digits"}

_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to ``1``/``true``/``yes``/``on``."""
    return os.environ.get(name, "").strip().lower() in _TRUE


def in_colab() -> bool:
    """True inside Google Colab (the ``google.colab`` module is importable only there)."""
    return "google.colab" in sys.modules


def default_data_root(start: str | os.PathLike | None = None) -> Path:
    """``data/`` at the repository root when running inside the repository (chapters run in ``book/``),
    else ``./data`` in the current directory (e.g. ``/content/data`` on Colab)."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "_toc.yml").is_file() and (d / "capsule_lib").is_dir():
            return d / "data"
    return here / "data"


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
        return f"capsule_lib: {mode} | {train} | device {self.device} | data {self.data_root}{offline} | seed {self.seed}"


def settings(SMOKE: bool = False, TRAIN: bool = False, EPOCHS: int = 1, DEVICE: str = "auto",
             DATA_ROOT: str = "", *, seed: int = 0, smoke_epochs: int = 1, style: bool = True,
             quiet: bool = False) -> Settings:
    """Turn a chapter's parameters into effective settings and apply them.

    * ``SMOKE`` is switched on by ``CAPSULE_SMOKE=1`` too (that is how ``make test`` runs nbval); in smoke
      mode ``EPOCHS`` is capped at ``smoke_epochs``.
    * ``DATA_ROOT``: ``""`` means ``$CAPSULE_DATA`` if set, else :func:`default_data_root`. The result is
      written back to ``CAPSULE_DATA`` so that every ``get_dataset`` call in the chapter uses it.
    * ``CAPSULE_OFFLINE=1``: no downloads; missing datasets are replaced by generated stand-ins.
    * ``DEVICE``: ``"auto"`` (cuda, then mps, then cpu) or any ``torch.device`` string.

    Seeds Python, NumPy and torch with ``seed``, sets the book's matplotlib style (``style=False`` keeps
    yours) and prints :meth:`Settings.banner` unless ``quiet``.
    """
    from .training import seed_everything, select_device

    smoke = bool(SMOKE) or env_flag("CAPSULE_SMOKE")
    epochs = int(EPOCHS)
    if epochs < 1:
        raise ValueError(f"EPOCHS must be >= 1, got {EPOCHS!r}")
    if smoke:
        epochs = min(epochs, smoke_epochs)
    root = Path(DATA_ROOT or os.environ.get("CAPSULE_DATA") or default_data_root()).expanduser().resolve()
    os.environ["CAPSULE_DATA"] = str(root)
    cfg = Settings(smoke=smoke, train=bool(TRAIN), epochs=epochs, device=select_device(DEVICE or "auto"),
                   data_root=root, offline=env_flag("CAPSULE_OFFLINE"), seed=int(seed))
    seed_everything(cfg.seed)
    if style:
        from .viz.plots import set_style

        set_style()
    if not quiet:
        print(cfg.banner())
    return cfg


def chapter_dataset(name: str, split: str, cfg: Settings, *, n_smoke: int = 512, standin: str | None = None,
                    **kwargs: Any):
    """Load ``name``/``split`` for a chapter, falling back to a generated stand-in where that is allowed.

    Real data is used whenever it is present (or downloadable). If it is not and ``cfg.smoke`` or
    ``cfg.offline`` is set, the stand-in (``standin``, default from :data:`STANDINS`) is loaded instead and
    a line starting with ``[GENERATED stand-in data]`` is printed; otherwise the clear
    :class:`~capsule_lib.data.DatasetUnavailableError` (dataset, fetch command, offline option) propagates.
    In smoke mode at most ``n_smoke`` samples are kept. Returns an :class:`~capsule_lib.data.ImageDataset`.
    """
    from .data import DatasetUnavailableError, get_dataset

    try:
        ds = get_dataset(name, cfg.data_root, split, **kwargs)
    except DatasetUnavailableError as err:
        if not (cfg.smoke or cfg.offline):
            raise
        alt = standin or STANDINS.get(name.lower().replace("-", "_"))
        if alt is None:
            raise DatasetUnavailableError(f"{err} (no generated stand-in is registered for {name!r})") from err
        print(f"[GENERATED stand-in data] {name} is not available here ({'smoke' if cfg.smoke else 'offline'} "
              f"mode): using {alt!r} instead. Numbers below are NOT {name} results.")
        ds = get_dataset(alt, cfg.data_root, split, n=n_smoke if cfg.smoke else None)
    if cfg.smoke and len(ds) > n_smoke:
        ds = ds.subset(n_smoke)
    print(ds.banner())
    return ds
