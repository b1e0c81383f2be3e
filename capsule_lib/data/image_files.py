"""Reading image files: one file to a ``uint8`` array of the size and channels chosen (:func:`read_image`, with PIL),
many files at once in worker processes (:func:`decode_files`), the decoded-images cache (:func:`load_cache`,
:func:`save_cache`) and the files read batch by batch while training (:class:`FileImages`, for images too large to
hold in memory). What to read, from which folder and at which size is decided by :mod:`capsule_lib.data.images`.

Decoding is PIL's (``Image.open``, ``convert``), resizing torchvision's (``resize`` of the shorter side, then
``center_crop``); nothing here parses an image format.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from .._contracts import checked

__all__ = [
    "GREY_MODES",
    "CACHE_FORMAT",
    "MAX_CACHED_SIDE",
    "MAX_UPSAMPLE",
    "BadImageError",
    "read_image",
    "read_images",
    "list_image_files",
    "decode_files",
    "Decoded",
    "load_cache",
    "save_cache",
    "FileImages",
    "write_image_folder",
]

#: PIL modes read as one grey channel (any other mode is read as RGB, e.g. palette, RGBA, CMYK)
GREY_MODES = frozenset({"1", "L", "LA", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
#: the decoded-images cache's format; a cache of another format (or another capsule_lib version) is rebuilt
CACHE_FORMAT = 2
#: images up to this side are decoded once and kept in memory (and the cache); larger ones are read while training
MAX_CACHED_SIDE = 64
#: an image whose shorter side is enlarged more than this many times is counted and said (``upsampled``)
MAX_UPSAMPLE = 4
#: files a worker decodes per task
_CHUNK = 256


class BadImageError(ValueError):
    """A file that PIL cannot read as an image (not an image, truncated, damaged)."""


def _pil_read(path: str, size: int, channels: int | None) -> tuple[np.ndarray, bool, bool, bool]:
    """``(uint8 [C, size, size], was grey, was resized, was upsampled more than MAX_UPSAMPLE times)`` of one file;
    ``channels`` ``None``: grey stays grey."""
    from PIL import Image
    from torchvision.transforms.functional import center_crop, resize

    with Image.open(path) as im:
        grey = im.mode in GREY_MODES
        if im.mode.startswith("I"):  # 16- or 32-bit grey: keep the top 8 of 16 bits (convert("L") would clip)
            arr = np.asarray(im, dtype=np.int64)
            im = Image.fromarray((arr >> 8 if arr.max() > 255 else arr).clip(0, 255).astype(np.uint8))
        want = "L" if channels == 1 or (channels is None and grey) else "RGB"
        im = im.convert(want)  # reads the pixels: a truncated or damaged file fails here
        resized = im.size != (size, size)
        upsampled = min(im.size) * MAX_UPSAMPLE < size
        if resized:
            im = center_crop(resize(im, size), size)  # the shorter side to size, then the middle square
        arr = np.array(im, dtype=np.uint8)  # a writable copy (torch.from_numpy wants one)
    return (arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)), grey, resized, upsampled


def read_image(path: str | os.PathLike, size: int, channels: int | None = None) -> np.ndarray:
    """One image file as ``uint8 [C, size, size]``: PIL decodes it, converts it to grey (``channels=1``) or RGB
    (``3``; ``None``: grey files stay grey, others become RGB), the shorter side is resized to ``size`` and the middle
    ``size x size`` square kept.

    Parameters
    ----------
    path : str or os.PathLike
        An image file (any format PIL reads).
    size : int
        The side of the square image returned.
    channels : int or None
        1, 3, or ``None`` (as the file is: grey or RGB).

    Returns
    -------
    numpy.ndarray
        ``uint8 [C, size, size]``.

    Raises
    ------
    BadImageError
        One line naming the file when PIL cannot read it (not an image, truncated).
    """
    try:
        return _pil_read(str(path), size, channels)[0]
    except (OSError, SyntaxError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
        raise BadImageError(f"{path}: not an image or damaged ({_reason(e)})") from None


def read_images(paths: Sequence[str | os.PathLike], size: int, channels: int | None) -> torch.Tensor:
    """:func:`read_image` of each of ``paths`` (in this process): ``uint8 [N, C, size, size]``; grey files are
    repeated to RGB when another file is in colour and ``channels`` is ``None``."""
    arrays = [read_image(p, size, channels) for p in paths]
    c = max(a.shape[0] for a in arrays)
    return torch.from_numpy(np.stack([np.repeat(a, c // a.shape[0], axis=0) for a in arrays]))


def list_image_files(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Image files from ``paths``: each a file (kept whatever its extension), or a folder (its image files at any
    depth, by torchvision's extensions, sorted; hidden files left out).

    Parameters
    ----------
    paths : str, os.PathLike or list
        Files and folders.

    Returns
    -------
    list of str
        The files, in the order given (a folder's sorted).

    Raises
    ------
    FileNotFoundError
        A path that does not exist, named in one line.
    ValueError
        No image file at all (a folder without any is named).
    """
    from torchvision.datasets.folder import IMG_EXTENSIONS

    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[str] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            found = sorted(
                str(f) for f in path.rglob("*") if f.suffix.lower() in IMG_EXTENSIONS and not f.name.startswith(".")
            )
            if not found:
                raise ValueError(f"{path}: no image files in this folder ({', '.join(IMG_EXTENSIONS)})")
            files += found
        elif path.is_file():
            files.append(str(path))
        else:
            raise FileNotFoundError(f"{path}: no such file or folder")
    if not files:
        raise ValueError("no image files given")
    return files


def _reason(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:120]}" if text else type(e).__name__


class _Chunks(torch.utils.data.Dataset):
    """Task ``k`` of :func:`decode_files`: decode files ``k * _CHUNK ...`` (run in a worker process)."""

    def __init__(self, files: Sequence[str], size: int, channels: int | None):
        self.files, self.size, self.channels = list(files), size, channels

    def __len__(self) -> int:
        return (len(self.files) + _CHUNK - 1) // _CHUNK

    def __getitem__(self, k: int) -> dict[str, Any]:
        part = self.files[k * _CHUNK : (k + 1) * _CHUNK]
        out = np.zeros((len(part), 3, self.size, self.size), dtype=np.uint8)
        grey, resized, up = (np.zeros(len(part), bool) for _ in range(3))
        bad = []
        for i, path in enumerate(part):
            try:
                arr, grey[i], resized[i], up[i] = _pil_read(path, self.size, self.channels)
            except (OSError, SyntaxError, ValueError) as e:
                bad.append((k * _CHUNK + i, _reason(e)))
                continue
            out[i] = arr  # one grey channel is broadcast to the three (PIL's L -> RGB: R = G = B)
        return {"start": k * _CHUNK, "images": out, "grey": grey, "resized": resized, "upsampled": up, "bad": bad}


@dataclass
class Decoded:
    """What :func:`decode_files` read.

    Attributes
    ----------
    images : torch.Tensor
        ``uint8 [N, C, S, S]`` of the files read (the bad ones left out), ``C`` 1 when every file was grey (or
        ``channels=1``), else 3.
    keep : torch.Tensor
        ``bool [len(files)]``: which files were read.
    grey : int
        Grey files among those read (converted to RGB when ``C`` is 3).
    colour : int
        Colour files among those read (converted to grey when ``C`` is 1).
    resized : int
        Files that were not ``S x S`` (resized and centre-cropped).
    bad : list of tuple
        ``(file, reason)`` of each file PIL could not read.
    upsampled : int
        Files whose shorter side was enlarged more than :data:`MAX_UPSAMPLE` times (a 1 x 1 image made 28 x 28).
    """

    images: torch.Tensor
    keep: torch.Tensor
    grey: int
    colour: int
    resized: int
    bad: list[tuple[str, str]]
    upsampled: int = 0


def decode_files(
    files: Sequence[str],
    size: int,
    channels: int | None = None,
    *,
    skip_bad: bool = False,
    workers: int | None = None,
) -> Decoded:
    """Decode ``files`` with :func:`read_image` in ``workers`` processes (default: the CPU count, at most 8; none
    for fewer than 2,000 files), ``_CHUNK`` files per task.

    Parameters
    ----------
    files : sequence of str
        Image files.
    size : int
        The side every image is resized and centre-cropped to.
    channels : int or None
        1 or 3, or ``None``: 1 when every file is grey, else 3 (grey files repeated to RGB, and counted).
    skip_bad : bool
        Leave out the files PIL cannot read (``Decoded.bad`` names them) instead of raising.
    workers : int or None
        Worker processes (0: decode here).

    Returns
    -------
    Decoded
        The images and what was done to them.

    Raises
    ------
    BadImageError
        The first file PIL cannot read, named with the fix, unless ``skip_bad``.
    """
    n = len(files)
    if workers is None:
        workers = 0 if n < 2000 else min(8, os.cpu_count() or 1)
    loader = torch.utils.data.DataLoader(_Chunks(files, size, channels), batch_size=None, num_workers=workers)
    out = np.zeros((n, 3, size, size), dtype=np.uint8)
    grey, resized, up, keep, bad = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool), np.ones(n, bool), []
    for part in loader:
        lo = int(part["start"])
        hi = lo + len(part["grey"])
        out[lo:hi], grey[lo:hi], resized[lo:hi] = part["images"], part["grey"], part["resized"]
        up[lo:hi] = part["upsampled"]
        for i, why in part["bad"]:
            if not skip_bad:
                raise BadImageError(
                    f"{files[i]}: not an image or damaged ({why}); delete or replace it, or skip such files "
                    f"(--skip-bad-files, skip_bad=True: how many were skipped is reported)"
                )
            keep[i] = False
            bad.append((files[i], why))
    one = channels == 1 or (channels is None and bool(grey[keep].all()))
    images = torch.from_numpy(out[keep][:, :1] if one else out[keep])
    n_grey, n_kept = int(grey[keep].sum()), int(keep.sum())
    return Decoded(
        images,
        torch.from_numpy(keep),
        grey=n_grey if not one else 0,
        colour=n_kept - n_grey if one else 0,
        resized=int(resized[keep].sum()),
        bad=bad,
        upsampled=int(up[keep].sum()),
    )


# ----------------------------------------------------------------------------------------------- the cache
def _digest(images: torch.Tensor) -> str:
    return hashlib.sha256(images.contiguous().numpy().tobytes()).hexdigest()


def load_cache(path: Path, key: str, version: str) -> dict[str, Any] | None:
    """The cache file ``path`` if it was written for ``key`` (the folder's files and the reading options) by this
    ``version`` of the library in :data:`CACHE_FORMAT`, and its images are the bytes it recorded; else ``None`` and a
    line saying why it is rebuilt (a missing file says nothing)."""
    if not path.is_file():
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        why = ""
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT or data.get("version") != version:
            why = "written by another version of capsule_lib"
        elif data.get("key") != key:
            why = "written for other images or other options"
        elif _digest(data["images"]) != data.get("sha256"):
            why = "its images are not the bytes it recorded (damaged)"
    except Exception as e:  # noqa: BLE001 - any unreadable file is rebuilt, never trusted
        why = f"unreadable ({_reason(e)})"
    if why:
        print(f"image cache {path}: {why}; rebuilding it", flush=True)
        return None
    return data


def save_cache(path: Path, key: str, version: str, record: dict[str, Any]) -> None:
    """Write ``record`` (tensors and plain values; ``record["images"]`` the decoded ``uint8`` images) as the cache
    ``path`` for ``key``, through a temporary file and a rename (a crash leaves no half-written cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    data = {**record, "format": CACHE_FORMAT, "version": version, "key": key, "sha256": _digest(record["images"])}
    torch.save(data, tmp)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------ read while training
class FileImages:
    """Images read from their files when a batch needs them (for images larger than :data:`MAX_CACHED_SIDE`): the
    ``images`` of an :class:`~capsule_lib.data.ImageDataset` whose batches
    :class:`~capsule_lib.data.loaders.StreamLoader` reads in worker processes.

    Indexed like a tensor ``uint8 [N, C, S, S]``: an integer gives the decoded image, a slice or an index tensor a
    :class:`FileImages` of those files (nothing is read); :meth:`load` reads a batch. ``fingerprint()`` is the
    files' names, sizes and modification times with the reading options (what a run records instead of pixels).

    Parameters
    ----------
    files : sequence of str
        Image files.
    size : int
        Their side once read.
    channels : int
        1 or 3.
    key : str
        The fingerprint of the whole folder and its reading options.
    """

    dtype = torch.uint8

    def __init__(self, files: Sequence[str], size: int, channels: int, key: str):
        self.files, self.size, self.channels, self.key = list(files), size, channels, key

    @property
    def shape(self) -> torch.Size:
        return torch.Size([len(self.files), self.channels, self.size, self.size])

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, int):
            return torch.from_numpy(read_image(self.files[index], self.size, self.channels))
        picked = np.asarray(self.files, dtype=object)[np.asarray(index) if not isinstance(index, slice) else index]
        return FileImages(list(picked), self.size, self.channels, self.key)

    def load(self, index: Any = slice(None)) -> torch.Tensor:
        """Read the files at ``index`` (default all): ``uint8 [n, C, S, S]``."""
        return read_images(self[index].files, self.size, self.channels)

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.key.encode())
        h.update("\n".join(self.files).encode())
        return h.hexdigest()[:16]


@checked
def write_image_folder(
    images: torch.Tensor, labels: torch.Tensor, classes: Sequence[str], folder: str | os.PathLike, suffix: str = ".png"
) -> list[Path]:
    """Write images as files in the ``ImageFolder`` layout, ``folder/<class>/<k>.png`` (PIL; what the book's page
    and the tests make a folder of "your own images" from).

    Parameters
    ----------
    images : torch.Tensor
        ``uint8 [N, C, H, W]`` (C 1 or 3) or floats in [0, 1].
    labels : torch.Tensor
        ``[N]`` class indices.
    classes : sequence of str
        The class folders' names, in label order.
    folder : str or os.PathLike
        Where to write (created; existing files of the same names are replaced).
    suffix : str
        The file type, by its extension (``".png"``, ``".jpg"``, ...).

    Returns
    -------
    list of pathlib.Path
        The files written, in the order of ``images``.
    """
    from PIL import Image

    x = images if images.dtype == torch.uint8 else (images.clamp(0, 1) * 255).round().to(torch.uint8)
    root = Path(folder)
    counts: dict[int, int] = {}
    paths = []
    for img, y in zip(x.cpu(), labels.tolist()):
        k = counts[y] = counts.get(y, -1) + 1
        path = root / classes[y] / f"{k:05d}{suffix}"
        path.parent.mkdir(parents=True, exist_ok=True)
        arr = img.numpy()
        Image.fromarray(arr[0] if arr.shape[0] == 1 else arr.transpose(1, 2, 0)).save(path)
        paths.append(path)
    return paths
