"""``get_dataset(name, data_root, split, ...)``: one entry point for real and generated datasets.

Real datasets live under one data root (``data_root`` argument, else the repository's ``data/``, else ``./data``),
one sub-folder per dataset, e.g. ``<data root>/mnist/MNIST/raw/*.gz`` (torchvision's layout; which files are there is
decided from the files themselves by :func:`~capsule_lib.data.files.find_real_data`). Missing files are
downloaded with torchvision when the network allows (never with ``offline=True``), through a temporary folder, so
a failed download leaves the data root as it was; otherwise a
:class:`DatasetUnavailableError` says which dataset is missing, the command that fetches it, and the offline
alternative (generated stand-in data). This module reads no environment variable: a chapter's
:func:`capsule_lib.notebook.settings` (``CAPSULE_DATA``, ``CAPSULE_OFFLINE``) and the command line pass the data
root and the offline decision down, together as a :class:`DataSource`.
"""
from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from .._checks import check_choice
from .files import download_into, download_reason, find_real_data, permission_denied
from .._contracts import checked

__all__ = [
    "ImageDataset", "DatasetUnavailableError", "get_dataset", "register_dataset", "available_datasets",
    "data_root", "DataSource", "read_idx", "train_val_indices", "STANDINS", "data_fingerprint", "check_labels",
    "announce_standins",
]

_REGISTRY: dict[str, Callable[..., "ImageDataset"]] = {}

#: The generated stand-in of each real dataset, as ``name -> (stand-in name, keyword overrides)``, used by
#: :func:`get_dataset` when the real data cannot be had and stand-ins are allowed.
STANDINS: dict[str, tuple[str, dict[str, Any]]] = {
    "mnist": ("glyph_digits", {}),
    "multimnist": ("multimnist", {"source": "glyph_digits"}),
    "affine_mnist": ("affine_mnist", {"source": "glyph_digits"}),
    "smallnorb": ("rendered_norb", {}),
    "cifar10": ("colour_shapes", {}),
}
STANDIN_MARK = "[GENERATED stand-in data]"
_ANNOUNCED: set[tuple[str, str, str]] = set()  # (dataset, data root, split) already announced in this process
_ANNOUNCE = [True]  # False once a page has said it runs on stand-ins (announce_standins)


def announce_standins(on: bool) -> bool:
    """Whether :func:`get_dataset` prints its ``[GENERATED stand-in data]`` line when it falls back to a stand-in
    (default on). A chapter that has already said so once at the top of its page turns it off
    (:func:`capsule_lib.notebook.settings`), so the page carries one notice instead of one per dataset load.
    Returns the previous setting."""
    previous, _ANNOUNCE[0] = _ANNOUNCE[0], bool(on)
    return previous


SPLITS = ("train", "val", "train_full", "test")


class DatasetUnavailableError(FileNotFoundError):
    """A dataset's files are missing and could not be downloaded."""


@dataclass
class ImageDataset:
    """An in-memory image dataset.

    ``images``: ``uint8 [N, C, H, W]`` (or float in [0, 1]); ``labels``: ``int64 [N]`` (or ``[N, k]`` for
    multi-label sets). ``generated`` marks synthetic stand-ins; ``description`` says what the data is and
    is shown by the chapters. ``extra`` holds additional per-sample tensors (e.g. MultiMNIST sources or
    smallNORB label fields), each with first dimension ``N``.
    """

    name: str
    split: str
    images: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    generated: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    standin_for: str | None = None  # set by get_dataset when this generated set replaces a real one

    def __len__(self) -> int:
        return self.images.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.images[i]
        if x.dtype == torch.uint8:
            x = x.float() / 255.0
        return x, self.labels[i]

    def subset(self, index: torch.Tensor | slice | int) -> "ImageDataset":
        """A dataset of the selected samples (``index``: indices, a slice, or the first ``n``)."""
        if isinstance(index, int):
            index = slice(0, index)
        extra = {k: (v[index] if isinstance(v, torch.Tensor) and v.shape[:1] == self.labels.shape[:1] else v)
                 for k, v in self.extra.items()}
        return ImageDataset(self.name, self.split, self.images[index], self.labels[index], self.classes,
                            self.generated, self.description, extra, self.standin_for)

    def fingerprint(self, samples: int = 256) -> str:
        """A cheap content fingerprint (sha256, 16 hex digits) of this dataset: its size, image shape and dtype, every
        label and ``samples`` images at evenly spaced indices. Two sets of the same name and size but other images
        (another generator seed, altered files) differ; a run records it in its identity, so it never resumes onto
        other data (:meth:`capsule_lib.train.trainer.Trainer.identity`)."""
        return data_fingerprint(self.images, self.labels, samples)

    def float_images(self) -> torch.Tensor:
        return self.images.float() / 255.0 if self.images.dtype == torch.uint8 else self.images

    def banner(self) -> str:
        """One line for chapter output: what data this is (loudly, when generated)."""
        kind = "GENERATED stand-in data" if self.generated else "real data"
        return f"[{kind}] {self.name}/{self.split}: {len(self)} images {tuple(self.images.shape[1:])}. {self.description}"


def data_fingerprint(images: torch.Tensor, labels: torch.Tensor, samples: int = 256) -> str:
    """:meth:`ImageDataset.fingerprint` for any ``images [N, ...]`` and ``labels [N, ...]`` (images read from their
    files while training, :class:`~capsule_lib.data.image_files.FileImages`, by their ``fingerprint()``)."""
    import hashlib

    n = images.shape[0]
    h = hashlib.sha256(f"{tuple(images.shape)} {images.dtype} {tuple(labels.shape)}".encode())
    h.update(labels.detach().cpu().contiguous().numpy().tobytes())
    if not isinstance(images, torch.Tensor):  # images read from their files: their names, sizes and times
        h.update(images.fingerprint().encode())
    elif n:
        idx = torch.linspace(0, n - 1, min(samples, n)).round().long()
        h.update(images[idx].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def check_labels(labels: torch.Tensor, n_classes: int, name: str) -> None:
    """One line when a label is outside ``0 .. n_classes - 1`` (a wrong dataset for the model, or corrupt labels)."""
    if labels.numel() and labels.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= n_classes:
            raise ValueError(
                f"{name}: labels must be class indices 0..{n_classes - 1} for this model, got values in [{lo}, {hi}]"
            )


def register_dataset(name: str) -> Callable[[Callable[..., ImageDataset]], Callable[..., ImageDataset]]:
    """Decorator: register ``fn(root: Path, split: str, download: bool, **kw) -> ImageDataset``."""

    def deco(fn: Callable[..., ImageDataset]) -> Callable[..., ImageDataset]:
        _REGISTRY[name] = fn
        return fn

    return deco


def available_datasets() -> list[str]:
    return sorted(_REGISTRY)


def repository_root(start: str | os.PathLike | None = None) -> Path | None:
    """The book's repository (the folder with ``_toc.yml`` and ``capsule_lib/``) that contains ``start`` (default:
    the current directory), or ``None`` outside it."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "_toc.yml").is_file() and (d / "capsule_lib").is_dir():
            return d
    return None


def data_root(root: str | os.PathLike | None = None, *, start: str | os.PathLike | None = None) -> Path:
    """The one resolution of the data root: ``root`` if given, else ``data/`` at the repository root when running
    inside the repository (chapters run in ``book/``), else ``./data`` in the current directory (e.g.
    ``/content/data`` on Colab). ``start`` replaces the current directory. (A chapter's ``$CAPSULE_DATA`` arrives
    here as ``root``, from :func:`capsule_lib.notebook.settings`.)"""
    if root:
        return Path(root).expanduser()
    repo = repository_root(start)
    return repo / "data" if repo is not None else Path(start or os.getcwd()).resolve() / "data"


@dataclass(frozen=True)
class DataSource:
    """Where the datasets come from and what happens when one is missing: the decision a chapter
    (:attr:`capsule_lib.notebook.Settings.data`) or the command line makes once and passes down to every
    dataset load.

    Attributes
    ----------
    data_root : pathlib.Path
        The data root: the folder given, or where :func:`data_root` resolves ``None`` (``str`` or ``None`` may be
        passed; the folder is resolved here, once, when the source is made, and :func:`get_dataset` reads it as is).
    offline : bool
        Never download; with ``standin=None`` a missing dataset is replaced by its generated stand-in.
    standin : bool or None
        What to do when the real data is neither under the root nor downloadable: ``True`` load the generated
        stand-in, ``False`` raise :class:`DatasetUnavailableError`, ``None`` (default) as ``offline``.
    cache : pathlib.Path or None
        Where the reader's decoded images are kept between runs (:mod:`capsule_lib.data.images`; ``train`` sets
        the folder ``image_cache`` next to its run); ``None`` (default): nowhere.
    """

    data_root: Path | str | None = None
    offline: bool = False
    standin: bool | None = None
    cache: Path | str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_root", data_root(self.data_root))  # the one resolution of the folder
        if self.cache is not None:
            object.__setattr__(self, "cache", Path(self.cache).expanduser())

    @classmethod
    def of(cls, data_root: DataSource | str | os.PathLike | None, **changes: Any) -> DataSource:
        """``data_root`` as a :class:`DataSource` (a plain path or ``None`` is a root, online, no stand-in),
        with the fields in ``changes`` that are not ``None`` replaced."""
        base = data_root if isinstance(data_root, DataSource) else cls(data_root)
        changes = {k: v for k, v in changes.items() if v is not None}
        fields = {"data_root": base.data_root, "offline": base.offline, "standin": base.standin, "cache": base.cache}
        return cls(**{**fields, **changes})

    def get(self, name: str, split: str = "train", **kwargs: Any) -> ImageDataset:
        """:func:`get_dataset` ``(name, split)`` from this source."""
        return get_dataset(name, self, split, **kwargs)


@checked
def get_dataset(
    name: str,
    data_root: DataSource | str | os.PathLike | None = None,
    split: str = "train",
    *,
    download: bool = True,
    standin: bool | None = None,
    offline: bool | None = None,
    **kwargs: Any,
) -> ImageDataset:
    """Load dataset ``name`` (see :func:`available_datasets`) for ``split``.

    Splits: ``"train"`` (training part), ``"val"`` (a held-out part of the official training set, used
    for model selection), ``"train_full"`` (train + val), ``"test"`` (never used for selection).
    Generated datasets accept ``n`` and ``seed``. A name ``"kind:argument"`` passes ``argument`` (and the source) to
    the dataset registered as ``kind``: ``"images:PATH"`` is a folder of the reader's images
    (:mod:`capsule_lib.data.images`).

    Parameters
    ----------
    name : str
        A registered dataset (``"mnist"``, ``"smallnorb"``, ``"rendered_norb"``, ...).
    data_root : DataSource or str or os.PathLike or None
        The data root (:func:`data_root` resolves ``None``), or a :class:`DataSource` that also carries
        ``offline`` and ``standin`` (the keyword arguments below override it when given).
    split : str
        ``"train"``, ``"val"``, ``"train_full"`` or ``"test"``.
    download : bool
        Download missing real data with torchvision (never when offline).
    standin : bool or None
        What to do when the real data is neither under the data root nor downloadable. ``False``: raise
        :class:`DatasetUnavailableError` (dataset, fetch command, offline option). ``True``: load the generated
        stand-in registered in :data:`STANDINS` instead and print one line starting with
        ``[GENERATED stand-in data]``; the returned dataset has ``generated=True``. ``None`` (default): ``True``
        when offline, else ``False``. This is the only place where the fallback is decided, so chapters,
        recipes and scripts behave alike.
    offline : bool or None
        No download is attempted (a chapter's ``CAPSULE_OFFLINE=1``, passed down by
        :func:`capsule_lib.notebook.settings`); default ``False`` (or the source's).
    kwargs
        Keyword arguments: passed to the dataset's loader (e.g. ``n``, ``seed``, ``variant``).

    Returns
    -------
    ImageDataset
        The split, or its generated stand-in (``standin_for`` names the dataset it replaces).
    """
    kind, sep, argument = name.partition(":")  # "kind:argument", e.g. "images:PATH" (capsule_lib.data.images)
    key = kind.lower().replace("-", "_")
    if key not in _REGISTRY:
        raise ValueError(f"unknown dataset name {name!r}; available: {', '.join(available_datasets())}")
    source = DataSource.of(data_root, offline=offline, standin=standin)
    offline = source.offline
    allow = offline if source.standin is None else bool(source.standin)
    folder = source.data_root  # resolved once, when the source was made
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"data_root {str(folder)!r} is a file; give the folder that holds the datasets")
    if sep:
        kwargs = {**kwargs, "argument": argument, "source": source}
    try:
        return _REGISTRY[key](folder, split, download and not offline, **kwargs)
    except PermissionError as err:  # an unreadable folder or file: one line, whichever reader met it
        if err.errno is None:  # already said in one line (read_idx)
            raise
        raise permission_denied(err, folder) from None
    except DatasetUnavailableError as err:
        if not allow:
            raise
        if key not in STANDINS:
            raise DatasetUnavailableError(f"{err} (no generated stand-in is registered for {name!r})") from err
        alt, overrides = STANDINS[key]
        why = "offline mode" if offline else "not under the data root and could not be downloaded"
        if _ANNOUNCE[0] and (key, str(folder), split) not in _ANNOUNCED:  # once per dataset, root, split
            _ANNOUNCED.add((key, str(folder), split))
            print(
                f"{STANDIN_MARK} {name} is not available here ({why}): using {alt!r}"
                f"{' built from glyph_digits' if overrides.get('source') == 'glyph_digits' else ''} instead. "
                f"Numbers below are NOT {name} results.",
                flush=True,
            )
        ds = _REGISTRY[alt](folder, split, False, **{**kwargs, **overrides})
        ds.standin_for = name
        return ds


def unavailable(dataset: str, where: Path, script: str, reason: str = "") -> DatasetUnavailableError:
    why = f" ({reason})" if reason else ""
    return DatasetUnavailableError(
        f"{dataset} is not in {where} and could not be downloaded{why}. Fetch it where there is internet "
        f"(`python data_scripts/{script} --root {where.parent}`), point CAPSULE_DATA / DATA_ROOT at it, "
        f"or run offline on generated stand-ins (CAPSULE_OFFLINE=1, offline=True)."
    )


def train_val_indices(n: int, val_size: int, seed: int = 12345) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed, seeded split of ``range(n)`` into (train, val) indices."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[val_size:].sort().values, perm[:val_size].sort().values


def _select_split(x: torch.Tensor, y: torch.Tensor, split: str, val_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    if split == "train_full":
        return x, y
    tr, va = train_val_indices(x.shape[0], val_size)
    idx = tr if split == "train" else va
    return x[idx], y[idx]


def _check_split(split: str, allowed: tuple[str, ...] = SPLITS) -> None:
    check_choice(split, allowed, "split")


# ----------------------------------------------------------------------------------------- IDX (MNIST)
def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (``.gz`` or raw): big-endian magic ``0x0000 <type> <ndim>``, dims, then data."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rb") as f:
            data = f.read()
    except PermissionError as e:  # not damaged: this user may not read it
        raise permission_denied(e, p) from None
    except (EOFError, OSError, gzip.BadGzipFile) as e:  # truncated download, not gzip
        raise ValueError(f"{p}: corrupt or truncated file ({type(e).__name__}: {e}); delete it and fetch it again "
                         f"(python data_scripts/mnist.py --root <data root> verifies checksums)") from None
    if len(data) < 4:
        raise ValueError(f"{p}: truncated IDX file ({len(data)} bytes)")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ValueError(f"{p}: not a uint8 IDX file (magic bytes {data[:4].hex()})")
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    offset = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(data) - offset != count:
        raise ValueError(f"{p}: expected {count} bytes of data for shape {dims}, found {len(data) - offset}")
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def _torchvision_mnist_like(cls_name: str, folder: Path, dataset: str, script: str, download: bool) -> None:
    """Download with torchvision into ``folder`` (through a temporary folder: a failed download leaves nothing
    behind) or raise a clear error."""
    if not download:
        raise unavailable(dataset, folder, script, "offline, or download=False")

    def fetch(tmp: Path) -> None:
        import torchvision.datasets as tvd

        getattr(tvd, cls_name)(str(tmp), train=True, download=True)
        getattr(tvd, cls_name)(str(tmp), train=False, download=True)

    try:
        download_into(folder, fetch)
    except Exception as e:  # network errors come in many types
        raise unavailable(dataset, folder, script, download_reason(e)) from e


def _load_mnist_like(dataset: str, sub: str, cls_name: str, classes: list[str], script: str):
    def load(root: Path, split: str, download: bool, val_size: int = 5000, **_: Any) -> ImageDataset:
        _check_split(split)
        folder = root / sub
        raw = folder / cls_name / "raw"
        part = "test" if split == "test" else "train"
        img_stem, lab_stem = _MNIST_FILES[part]
        files = find_real_data(dataset, root).files  # the one look at what the data root holds
        if img_stem not in files or lab_stem not in files:
            _torchvision_mnist_like(cls_name, folder, dataset, script, download)
            files = find_real_data(dataset, root).files
            if img_stem not in files or lab_stem not in files:
                raise unavailable(dataset, folder, script, "the download left no files")
        x = torch.from_numpy(read_idx(files[img_stem]).copy()).unsqueeze(1)  # [N, 1, 28, 28] uint8
        y = torch.from_numpy(read_idx(files[lab_stem]).astype(np.int64))  # [N]
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{files[img_stem]} has {x.shape[0]} images but {files[lab_stem]} has "
                             f"{y.shape[0]} labels; the files do not belong together. Delete them and fetch them "
                             f"again (python data_scripts/{script} --root <data root> verifies checksums)")
        if part == "train":
            x, y = _select_split(x, y, split, val_size)
        return ImageDataset(dataset, split, x, y, classes,
                            description=f"{dataset} from <data root>/{raw.relative_to(root).as_posix()}" + (f" (val = {val_size} held-out training images)" if split == "val" else ""))

    return load


register_dataset("mnist")(_load_mnist_like("mnist", "mnist", "MNIST", [str(i) for i in range(10)], "mnist.py"))
register_dataset("fashion_mnist")(_load_mnist_like(
    "fashion_mnist", "fashion_mnist", "FashionMNIST",
    ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"],
    "fashion_mnist.py"))


# ----------------------------------------------------------------------------------------- CIFAR
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _cifar_from_npz(folder: Path, split: str) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
    """Offline copies as ``train_0..4.npz`` / ``test.npz`` with keys ``x`` (N,32,32,3) and ``y``."""
    files = [folder / f"train_{k}.npz" for k in range(5)] if split != "test" else [folder / "test.npz"]
    if not all(f.exists() for f in files):
        return None
    parts = [np.load(f) for f in files]
    x = torch.from_numpy(np.concatenate([p["x"] for p in parts])).permute(0, 3, 1, 2).contiguous()
    y = torch.from_numpy(np.concatenate([p["y"] for p in parts]).astype(np.int64))
    extra = {}
    if split == "test" and "exact" in parts[0].files:
        extra["exact"] = torch.from_numpy(parts[0]["exact"].astype(bool))
    return x, y, extra


_CIFAR_BATCHES = {
    10: ("cifar-10-batches-py", [f"data_batch_{k}" for k in range(1, 6)], ["test_batch"], b"labels"),
    100: ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}


def _cifar_from_batches(folder: Path, split: str, n_classes: int) -> tuple[torch.Tensor, torch.Tensor, dict] | None:
    """The python-pickle batches of the official archive (torchvision's layout, e.g.
    ``cifar-10-batches-py/data_batch_1..5`` and ``test_batch``): ``data`` uint8 ``[N, 3072]`` (R, G, B
    planes of 32x32) and ``labels`` (CIFAR-10) or ``fine_labels`` (CIFAR-100)."""
    import pickle

    sub, train, test, key = _CIFAR_BATCHES[n_classes]
    files = [folder / sub / f for f in (test if split == "test" else train)]
    if not all(f.exists() for f in files):
        return None
    xs, ys = [], []
    for f in files:
        with open(f, "rb") as fh:
            d = pickle.load(fh, encoding="bytes")
        data = np.asarray(d[b"data"], dtype=np.uint8)
        if data.ndim != 2 or data.shape[1] != 3072:
            raise ValueError(f"{f}: expected data of shape [N, 3072], got {data.shape}")
        xs.append(data.reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d[key], dtype=np.int64))
    return torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)), {}


def _load_cifar(dataset: str, sub: str, cls_name: str, script: str, n_classes: int):
    def load(root: Path, split: str, download: bool, val_size: int = 5000, **_: Any) -> ImageDataset:
        _check_split(split)
        folder = root / sub
        part = "test" if split == "test" else "train"
        got = _cifar_from_npz(folder, part)
        if got is None:
            got = _cifar_from_batches(folder, part, n_classes)
        if got is None:
            try:
                import torchvision.datasets as tvd

                ds = getattr(tvd, cls_name)(str(folder), train=(part == "train"), download=False)
            except Exception:
                if not download:
                    raise unavailable(dataset, folder, script, "offline, or download=False") from None
                try:  # through a temporary folder: a failed download leaves nothing behind
                    make = getattr(tvd, cls_name)
                    ds = download_into(folder, lambda tmp: make(str(tmp), train=(part == "train"), download=True))
                except Exception as e:
                    raise unavailable(dataset, folder, script, download_reason(e)) from e
            got = (torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous(),
                   torch.tensor(ds.targets, dtype=torch.int64), {})
        x, y, extra = got
        if part == "train":
            x, y = _select_split(x, y, split, val_size)
        classes = CIFAR10_CLASSES if n_classes == 10 else [str(i) for i in range(n_classes)]
        return ImageDataset(dataset, split, x, y, classes, description=f"{dataset} from <data root>/{sub}", extra=extra)

    return load


register_dataset("cifar10")(_load_cifar("cifar10", "cifar10", "CIFAR10", "cifar10.py", 10))
register_dataset("cifar100")(_load_cifar("cifar100", "cifar100", "CIFAR100", "cifar100.py", 100))
