"""What the data root holds, decided from the files themselves.

:func:`find_real_data` is the one answer to "is the real dataset here": the published files' names and sizes (read
from their headers, not from a folder's existence). The loaders of :mod:`capsule_lib.data.datasets` find their files
through it (so the chapters do, through :func:`~capsule_lib.data.get_dataset`), and so do ``make test`` and the tests'
``real_data`` fixture. :func:`download_into` runs a download in a temporary folder and moves its files into the data
root only once it has succeeded: a failed or interrupted download leaves the data root as it found it (torchvision
creates its folders, and a partial file, before the first byte arrives).
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import struct
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from .._checks import check_choice

__all__ = ["RealData", "REAL_FILES", "find_real_data", "download_into", "download_reason", "permission_denied"]

_T = TypeVar("_T")

#: MNIST's four IDX files and the shapes they hold as published (Fashion-MNIST's are the same)
_MNIST_SHAPES = {
    "train-images-idx3-ubyte": (60000, 28, 28),
    "train-labels-idx1-ubyte": (60000,),
    "t10k-images-idx3-ubyte": (10000, 28, 28),
    "t10k-labels-idx1-ubyte": (10000,),
}

#: The real datasets whose files :func:`find_real_data` knows: ``name -> (label, folder under the data root,
#: {file name: published IDX shape})``. A file may be stored as ``<name>`` or ``<name>.gz`` (torchvision keeps both).
REAL_FILES: dict[str, tuple[str, str, dict[str, tuple[int, ...]]]] = {
    "mnist": ("MNIST", "mnist/MNIST/raw", _MNIST_SHAPES),
    "fashion_mnist": ("Fashion-MNIST", "fashion_mnist/FashionMNIST/raw", _MNIST_SHAPES),
}


@dataclass(frozen=True)
class RealData:
    """What :func:`find_real_data` found of a real dataset under a data root; true when the published dataset is
    there, complete.

    Attributes
    ----------
    dataset : str
        The dataset's name (a key of :data:`REAL_FILES`).
    folder : pathlib.Path
        The folder its files belong in.
    files : dict
        The files present, by name (``<name>``, else ``<name>.gz``), complete or not: what a loader reads.
    problem : str
        Why this is not the published dataset, ``""`` when it is: no files, a file missing, another number of images,
        a file cut short.
    """

    dataset: str
    folder: Path
    files: dict[str, Path] = field(default_factory=dict)
    problem: str = ""

    def __bool__(self) -> bool:
        return not self.problem


def find_real_data(name: str, root: str | os.PathLike) -> RealData:
    """Whether the real dataset ``name`` (a key of :data:`REAL_FILES`) is under the data root ``root``, from its
    files: each published file present (uncompressed or ``.gz``) with the published shape in its header and as many
    bytes as that shape needs (a ``.gz`` file's gzip trailer records its uncompressed size). Reads a few bytes of
    each file; a file this user may not read raises ``PermissionError``.

    Parameters
    ----------
    name : str
        ``"mnist"`` or ``"fashion_mnist"``.
    root : str or os.PathLike
        The data root.

    Returns
    -------
    RealData
        True when the published dataset is there; else its ``problem`` says why not. Its ``files`` are those present.
    """
    check_choice(name, tuple(REAL_FILES), "dataset")
    label, sub, shapes = REAL_FILES[name]
    folder = Path(root) / sub
    files = {stem: path for stem in shapes if (path := _present(folder, stem)) is not None}
    if not files:
        return RealData(name, folder, {}, f"no {label} files in {folder}")
    problems = [f"{stem}(.gz) missing" for stem in shapes if stem not in files]
    problems += [p for stem, path in files.items() if (p := _idx_problem(path, shapes[stem]))]
    return RealData(name, folder, files, "; ".join(problems))


def _present(folder: Path, stem: str) -> Path | None:
    for path in (folder / stem, folder / f"{stem}.gz"):
        if path.is_file():
            return path
    return None


def _idx_problem(path: Path, shape: tuple[int, ...]) -> str:
    """Why ``path`` is not an IDX file of ``shape`` with all its bytes (``""`` when it is)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                head = f.read(4 + 4 * len(shape))
            with open(path, "rb") as f:
                f.seek(-4, os.SEEK_END)
                size = struct.unpack("<I", f.read(4))[0]  # gzip's ISIZE: the uncompressed size mod 2**32
        else:
            with open(path, "rb") as f:
                head = f.read(4 + 4 * len(shape))
            size = path.stat().st_size
    except PermissionError:
        raise
    except (OSError, EOFError, zlib.error) as e:
        return f"{path.name}: unreadable ({type(e).__name__}: {e})"
    if len(head) < 4 + 4 * len(shape) or head[:3] != b"\0\0\x08" or head[3] != len(shape):
        return f"{path.name}: not an IDX file of {len(shape)} dimensions"
    dims = struct.unpack(f">{len(shape)}I", head[4:])
    if dims != shape:
        what = "images" if len(shape) > 1 else "labels"
        if dims[1:] != shape[1:]:
            return f"{path.name}: {what} of shape {dims[1:]}, the published file has {shape[1:]}"
        return f"{path.name}: {dims[0]} {what}, the published file has {shape[0]}"
    want = len(head) + _prod(shape)
    if size != want % 2**32:
        return f"{path.name}: truncated ({size} of {want} bytes)"
    return ""


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def download_into(folder: Path, fetch: Callable[[Path], _T]) -> _T:
    """Run ``fetch(tmp)`` (e.g. a torchvision download into ``tmp``) in a new temporary folder; when it returns, move
    every file it wrote to the same place under ``folder`` (each through a ``.part`` name and a rename) and return its
    result. When it raises (no network, Ctrl-C), nothing under ``folder`` changes.

    Parameters
    ----------
    folder : pathlib.Path
        Where the files go (created when needed).
    fetch : callable
        ``fetch(tmp: pathlib.Path)``, writing its files under ``tmp``.

    Returns
    -------
    object
        What ``fetch`` returned.
    """
    with tempfile.TemporaryDirectory(prefix="capsule-download-") as tmp:
        result = fetch(Path(tmp))
        for src in sorted(Path(tmp).rglob("*")):
            if src.is_file():
                dest = folder / src.relative_to(tmp)
                dest.parent.mkdir(parents=True, exist_ok=True)
                part = dest.with_name(dest.name + ".part")
                shutil.move(src, part)
                os.replace(part, dest)
    return result


def download_reason(err: BaseException) -> str:
    """A failed download's cause in a few words, for a one-line message: the innermost reason (torchvision's
    ``<urlopen error ...>``), else the first line, without URLs, at most 100 characters."""
    text = str(err)
    inner = re.findall(r"<urlopen error (.*?)>", text)
    gist = inner[-1] if inner else next((line for line in text.splitlines() if line.strip()), "")
    gist = " ".join(re.sub(r"\(?https?://\S+", "", gist).split()).strip(" :,;")
    if len(gist) > 100:
        gist = gist[:100].rsplit(" ", 1)[0] + " ..."
    return gist or type(err).__name__


def permission_denied(err: PermissionError, root: str | os.PathLike) -> PermissionError:
    """One line for a data file or folder this user may not read (or, to download, write): which one, and what to
    do; it is not damaged, so nothing needs to be fetched again."""
    where = err.filename if err.filename is not None else root
    return PermissionError(
        f"{where}: permission denied (the file is not damaged: nothing to fetch again); give this user access "
        f"(e.g. chmod -R u+rwX {root}) or point the data root at another folder"
    )
