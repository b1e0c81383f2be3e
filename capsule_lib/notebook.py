"""What every chapter notebook does in its first cells, in one place.

A chapter starts with three cells::

    # 1. Colab only: install the library (a no-op anywhere else; see book/appendix/running.md)
    # 2. papermill "parameters" cell, plain literals only:
    SMOKE = False; TRAIN = False; EPOCHS = 15; DEVICE = "auto"; DATA_ROOT = ""
    # 3. effective settings
    from capsule_lib.notebook import settings
    cfg = settings(SMOKE, TRAIN, EPOCHS, DEVICE, DATA_ROOT)

:func:`settings` reads the environment (``CAPSULE_SMOKE``, ``CAPSULE_DATA``, ``CAPSULE_OFFLINE``; it never
writes it) through :func:`environment`, the one place in ``capsule_lib`` that reads ``CAPSULE_*`` variables
(the library below takes them as arguments: ``cfg.data``, a :class:`~capsule_lib.data.DataSource`), picks the
device, seeds every generator, sets the figure style and prints one banner line, so a reader can see from the
output how the numbers below it were produced. :func:`chapter_dataset` loads a dataset the way every chapter
should: the real data when it is there (or downloadable), otherwise the generated stand-in, which says so
loudly (a chapter never stops for missing data).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ._checks import device_available
from ._contracts import checked
from .data.datasets import DataSource, announce_standins, available_datasets, repository_root

__all__ = [
    "Environment",
    "environment",
    "Settings",
    "settings",
    "env_flag",
    "in_colab",
    "chapter_dataset",
    "chapter_device",
    "display_path",
    "train_or_load",
    "try_dataset",
]

_TRUE = ("1", "true", "yes", "on")


def env_flag(name: str) -> bool:
    """True when the environment variable ``name`` is set to ``1``/``true``/``yes``/``on``."""
    return os.environ.get(name, "").strip().lower() in _TRUE


@dataclass(frozen=True)
class Environment:
    """What the ``CAPSULE_*`` environment variables ask for (see :func:`environment`).

    Attributes
    ----------
    smoke : bool
        ``CAPSULE_SMOKE=1``: chapters run in smoke mode (tiny subsets, one epoch).
    data_root : pathlib.Path or None
        ``CAPSULE_DATA``: the data root; ``None`` when unset.
    offline : bool
        ``CAPSULE_OFFLINE=1``: no download; missing datasets are replaced by generated stand-ins.
    """

    smoke: bool
    data_root: Path | None
    offline: bool


def environment() -> Environment:
    """The ``CAPSULE_*`` environment variables, read here and nowhere else in ``capsule_lib`` (a test checks it):
    :func:`settings` and the command line (``python -m capsule_lib.train``) pass them down as arguments."""
    data = os.environ.get("CAPSULE_DATA", "").strip()
    return Environment(
        smoke=env_flag("CAPSULE_SMOKE"),
        data_root=Path(data).expanduser() if data else None,
        offline=env_flag("CAPSULE_OFFLINE"),
    )


def in_colab() -> bool:
    """True inside Google Colab (the ``google.colab`` module is importable only there)."""
    return "google.colab" in sys.modules


def display_path(path: str | os.PathLike) -> str:
    """How a chapter prints a folder without printing the machine's absolute path: ``$CAPSULE_DATA`` when it is
    that folder, a path relative to the repository when inside it, else ``.../<name>``."""
    p = Path(path).expanduser().resolve()
    env = environment().data_root
    if env is not None and env.resolve() == p:
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

    @property
    def data(self) -> DataSource:
        """The :class:`~capsule_lib.data.DataSource` of this chapter's datasets (the data root, offline or not,
        and generated stand-ins for whatever is missing, so a chapter never stops for missing data). Pass it
        wherever a data root goes."""
        return DataSource(self.data_root, offline=self.offline, standin=True)


@checked
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
    data: Sequence[str] = (),
) -> Settings:
    """Turn a chapter's parameters into effective settings and apply them.

    * ``SMOKE`` is switched on by ``CAPSULE_SMOKE=1`` too (that is how ``make test`` runs nbval); in smoke
      mode ``EPOCHS`` is capped at ``smoke_epochs``.
    * ``DATA_ROOT``: ``""`` means ``$CAPSULE_DATA``, else what :func:`~capsule_lib.data.data_root` resolves (the
      repository's ``data/``, else ``./data``). The chapter passes ``cfg.data`` (data root, offline mode, stand-ins
      allowed) to every dataset and recipe call; the environment is not modified.
    * ``CAPSULE_OFFLINE=1``: no downloads; missing datasets are replaced by generated stand-ins.
    * ``DEVICE``: ``"auto"`` (cuda, then mps, then cpu) or any ``torch.device`` string; a device that is not
      available here falls back to the CPU with one printed line (:func:`chapter_device`).

    * ``data``: the datasets the page evaluates on (e.g. ``("mnist",)``). Those that are neither under the data
      root nor downloadable are named in one ``[GENERATED stand-in data]`` notice printed here, at the top of the
      page; the page's later dataset loads then say nothing more (one notice per page).

    Seeds Python, NumPy and torch with ``seed``, sets the book's matplotlib style (``style=False`` keeps
    yours) and prints :meth:`Settings.banner` unless ``quiet``.
    """
    from .train import seed_everything

    env = environment()
    smoke = bool(SMOKE) or env.smoke
    epochs = int(EPOCHS)
    if epochs < 1:
        raise ValueError(f"EPOCHS must be >= 1, got {EPOCHS!r}")
    if smoke_epochs < 1:
        raise ValueError(f"smoke_epochs must be >= 1, got {smoke_epochs!r}")
    if smoke:
        epochs = min(epochs, smoke_epochs)
    if DATA_ROOT and Path(DATA_ROOT).exists() and not Path(DATA_ROOT).is_dir():
        raise ValueError(f"DATA_ROOT {DATA_ROOT!r} is a file; give the folder that holds the datasets (or '')")
    unknown = [name for name in data if str(name).split(":")[0] not in available_datasets()]
    if unknown:
        raise ValueError(f"data: unknown dataset name {unknown[0]!r}; available: {', '.join(available_datasets())}")
    source = DataSource(DATA_ROOT or env.data_root)  # the one resolution of the folder (DataSource, data_root())
    cfg = Settings(
        smoke=smoke,
        train=bool(TRAIN),
        epochs=epochs,
        device=chapter_device(DEVICE),
        data_root=source.data_root.resolve(),
        offline=env.offline,
        seed=int(seed),
    )
    seed_everything(cfg.seed)
    if style:
        from .viz.plots import set_style

        set_style()
    if not quiet:
        print(cfg.banner())
    announce_standins(True)  # a new page
    missing = [name for name in data if not _dataset_here(name, cfg)]
    if missing:
        _page_notice(cfg, ", ".join(missing))
    return cfg


_PAGE: dict[str, Settings | None] = {"cfg": None}  # the page (its settings) that has shown the stand-in notice


def _page_notice(cfg: Settings, names: str) -> None:
    """The page's one stand-in notice; afterwards the data layer's own stand-in lines are off for this page."""
    from .data.datasets import STANDIN_MARK

    if _PAGE["cfg"] is not cfg:
        why = "offline mode" if cfg.offline else "not under the data root and could not be downloaded"
        print(
            f"{STANDIN_MARK} {names} is not here ({why}): this page runs on generated stand-ins. Its text describes "
            f"the results on the real data; the numbers and figures below are computed on the stand-ins (their "
            f"tables say so) and differ from them."
        )
        _PAGE["cfg"] = cfg
    announce_standins(False)


def _dataset_here(name: str, cfg: Settings) -> bool:
    """Whether the real ``name`` can be had (its test split loads from the data root, or downloads)."""
    from .data import DatasetUnavailableError, get_dataset

    try:
        get_dataset(name, cfg.data_root, "test", offline=cfg.offline, standin=False)
    except DatasetUnavailableError:
        return False
    return True


def chapter_device(preference: str | torch.device | None = "auto") -> torch.device:
    """The device a chapter runs on: ``"auto"`` as :func:`~capsule_lib.train.runtime.select_device`; an explicit
    ``"cuda"``/``"mps"`` that this machine does not have falls back to the CPU with one printed line (a
    notebook written for Colab's GPU still runs on a laptop)."""
    from .train import select_device

    try:
        dev = select_device(preference or "auto")
    except (RuntimeError, TypeError):  # not a device name (torch lists 20 device types)
        raise ValueError(
            f"DEVICE {preference!r} is not a device name; use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'"
        ) from None
    if dev.type in ("cuda", "mps") and not device_available(torch.device(dev.type)):
        print(f"DEVICE={str(preference)!r} requested but {dev.type} is not available here: running on the CPU instead.")
        return torch.device("cpu")
    return dev


@checked
def chapter_dataset(name: str, split: str, cfg: Settings, *, n_smoke: int = 512, **kwargs: Any):
    """Load ``name``/``split`` for a chapter: :func:`~capsule_lib.data.get_dataset` from ``cfg.data`` (the data
    root, offline or not, stand-ins allowed).

    Real data is used whenever it is present (or downloadable); otherwise the generated stand-in registered in
    :data:`~capsule_lib.data.datasets.STANDINS` is loaded and, unless the page has said so already, a line starting
    with ``[GENERATED stand-in data]`` is printed (once per page; datasets without a stand-in raise the clear
    :class:`~capsule_lib.data.DatasetUnavailableError`). In smoke mode at most ``n_smoke`` samples are kept.
    Prints the dataset's one-line banner and returns the :class:`~capsule_lib.data.ImageDataset`.
    """
    from .data import get_dataset

    if n_smoke < 1:
        raise ValueError(f"chapter_dataset: n_smoke must be >= 1, got {n_smoke}")
    if cfg.smoke:
        kwargs.setdefault("n", n_smoke)  # generated sets: make only what is kept (real loaders ignore ``n``)
    said = announce_standins(False)  # the page's own notice below replaces the data layer's line
    try:
        ds = get_dataset(name, cfg.data, split, **kwargs)
    finally:
        announce_standins(said)
    if cfg.smoke and len(ds) > n_smoke:
        ds = ds.subset(n_smoke)
    print(ds.banner())
    if ds.standin_for:  # said once per page: at the top when settings(data=...) named it, else here
        _page_notice(cfg, ds.standin_for)
    return ds


@checked
def train_or_load(
    checkpoints: str | Sequence[str],
    cfg: Settings,
    *,
    retrain: Sequence[str] | None = None,
    train: bool | None = None,
    smoke: tuple[int, int] = (512, 256),
    budget: bool = False,
    start_from: str | None = None,
    run_suffix: str = "",
    speedrun: str | None = None,
    **overrides: Any,
):
    """A chapter's models: trained here when ``TRAIN`` is on, else the shipped checkpoints, in one call.

    Parameters
    ----------
    checkpoints
        A shipped checkpoint's name, or several.
    cfg
        The chapter's :class:`Settings`.
    retrain
        The checkpoints to retrain when training is on (default: all); the others are loaded.
    train
        Overrides ``cfg.train`` (e.g. a run that only makes sense on a GPU).
    smoke
        ``(train_subset, eval_subset)`` in smoke mode.
    budget
        Train for the shipped run's budget (the comparison chapter's contestants): its wall-clock minutes
        (``budget_minutes`` of its history; in smoke mode at most 0.05) instead of ``cfg.epochs``, or, for a run that
        had none, its own recipe's epochs.
    start_from
        Start the training from this shipped checkpoint's weights (:func:`~capsule_lib.train.run.train`).
    speedrun
        A shipped speedrun checkpoint (:mod:`capsule_lib.train.recipes.speedrun`): when training on a GPU, its recipe
        is retrained instead, for its run's time budget (the same network, trained for accuracy per minute); on a CPU
        the checkpoint's own recipe is, for ``cfg.epochs``.
    run_suffix
        Appended to the run folder ``runs/<checkpoint>`` (a smoke run adds ``_smoke``: it never resumes a full
        run).
    overrides
        Keyword arguments: recipe fields on top of the shipped run's recipe (``epochs`` defaults to ``cfg.epochs``).

    Returns
    -------
    tuple
        For one name ``(model, history)``; for several ``(models, histories)``, dicts keyed by checkpoint. Every
        model is on ``cfg.device`` in eval mode. Training retrains the shipped run's recipe
        (:func:`~capsule_lib.train.shipped.shipped_recipe`) with a live plot and resumable checkpoints under ``runs/``;
        the history is then the new run's.
    """
    from .pretrained import load_pretrained, load_pretrained_history
    from .train import shipped_recipe
    from .train import train as train_recipe
    from .viz import LivePlot

    names = [checkpoints] if isinstance(checkpoints, str) else list(checkpoints)
    if not names:
        raise ValueError("train_or_load: checkpoints must name at least one shipped checkpoint, got none")
    do_train = cfg.train if train is None else bool(train)
    retrain = names if retrain is None else list(retrain)
    strays = [r for r in retrain if r not in names]
    if strays:
        raise ValueError(f"train_or_load: retrain names {strays}, which are not among the checkpoints {names}")
    models: dict[str, nn.Module] = {}
    histories: dict[str, Any] = {}
    for name in names:
        if do_train and name in retrain:
            source = speedrun if speedrun is not None and torch.device(cfg.device).type == "cuda" else name
            timed = budget or source != name  # a speedrun trains for its run's budget, its epochs fitted to it
            minutes = load_pretrained_history(source).meta.get("budget_minutes") if timed else None
            if cfg.smoke and minutes is not None:
                minutes = min(minutes, 0.05)
            sub = {"train_subset": smoke[0], "eval_subset": smoke[1]} if cfg.smoke else {}
            epochs = {} if source != name or (budget and minutes is None) else {"epochs": cfg.epochs}
            recipe = shipped_recipe(source, **{**epochs, "device": str(cfg.device), **overrides})
            run_dir = f"runs/{source}{run_suffix}" + ("_smoke" if cfg.smoke else "")
            models[name], trainer = train_recipe(
                recipe,
                out_dir=run_dir,
                data_root=cfg.data,
                budget_minutes=minutes,
                start_from=start_from,
                callbacks=(LivePlot(),),
                **sub,
            )
            histories[name] = trainer.history
        else:
            models[name] = load_pretrained(name, map_location=cfg.device)[0]
            histories[name] = load_pretrained_history(name)
        models[name].to(cfg.device).eval()
    if isinstance(checkpoints, str):
        return models[names[0]], histories[names[0]]
    return models, histories


def try_dataset(name: str, cfg: Settings, split: str = "test", **kwargs: Any):
    """The real dataset ``name`` if it is under the data root (no download, no stand-in), else ``None``.

    Prints the dataset's banner, or that it is not here with the reason and the command that fetches it (the data
    root shown as :func:`display_path` shows it). For pages that show what each dataset looks like.
    """
    from .data import DatasetUnavailableError, get_dataset

    try:
        ds = get_dataset(name, cfg.data_root, split, download=False, standin=False, **kwargs)
    except (DatasetUnavailableError, FileNotFoundError) as e:
        why = str(e).split(". ", 1)[-1].replace(str(cfg.data_root), display_path(cfg.data_root).rstrip("/"))
        print(f"{name}: not available here. {why}")
        return None
    print(ds.banner())
    return ds
