"""A folder of the reader's images: :class:`ImageSource` (the folder and how to read it; its dataset name
``"images:PATH"``), the folder's listing (torchvision's ``make_dataset``; every refusal in one line that names the
folder or file and the fix), the image side chosen from the files, and their pixels: decoded in worker processes or
read back from the cache, or left to be read while training. What is decided, and how the splits and the
normalisation are made, is :mod:`capsule_lib.data.images`'s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import numpy as np
import torch

from .._contracts import check_value, resolve_hints
from .image_files import GREY_MODES, MAX_CACHED_SIDE, MAX_UPSAMPLE, Decoded, FileImages, decode_files, load_cache

__all__ = ["IMAGES", "SPLIT_NAMES", "ImageSource", "file_digest", "load_digests", "save_digests", "DIGEST_INDEX"]

#: the kind of a folder's dataset name, ``"images:PATH"`` (options after ``?``, see :attr:`ImageSource.spec`)
IMAGES = "images"
#: the split folders of a folder that brings its own splits (``valid`` and ``validation`` are read as ``val``)
SPLIT_NAMES = {"train": 0, "val": 1, "valid": 1, "validation": 1, "test": 2}
_SAMPLE = 256  # files whose size decides the image size


@dataclass(frozen=True)
class ImageSource:
    """A folder of images and how to read it (the options of :mod:`capsule_lib.data.images`); :attr:`spec` is its
    dataset name.

    Attributes
    ----------
    path : str
        The folder, as given (relative paths: to the current directory).
    image_size : int or None
        The side images are resized to; ``None``: decided from the files.
    channels : int or None
        1 (grey) or 3 (RGB); ``None``: decided from the files.
    val_fraction : float
        The share of each class's training images held out for validation where the folder has no ``val/``
        (default 0.1; the split must end up with images).
    test_fraction : float
        The same for the test split, where the folder has no ``test/`` (default 0.1).
    split_seed : int
        The seed of those held-out files.
    skip_bad : bool
        Leave out files PIL cannot read (counted) instead of refusing the folder.
    keep_small : bool
        Keep a class too small to give a validation and a test image (said in the summary line) instead of refusing
        the folder.
    """

    path: str
    image_size: int | None = None
    channels: int | None = None
    val_fraction: float = 0.1
    test_fraction: float = 0.1
    split_seed: int = 0
    skip_bad: bool = False
    keep_small: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise ValueError(f"ImageSource: path must be a folder's path (a str), got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))  # (frozen) a pathlib.Path as the str it stands for
        hints = resolve_hints(ImageSource)
        for f in dataclasses.fields(self):  # each option's type (True is no channel count, "3" no size), then ranges
            check_value(getattr(self, f.name), hints[f.name], f"ImageSource: {f.name}")
        _check_options(self.image_size, self.channels, self.val_fraction, self.test_fraction, self.split_seed)

    @property
    def spec(self) -> str:
        """``"images:PATH"``, with the options that differ from the defaults after ``?``
        (``"images:photos?image_size=32&skip_bad=1"``): what a recipe's ``dataset`` holds."""
        default = ImageSource(self.path)
        changed = {k: int(v) if isinstance(v, bool) else v for k, v in vars(self).items() if v != getattr(default, k)}
        changed.pop("path", None)
        return f"{IMAGES}:{self.path}" + (f"?{urlencode(changed)}" if changed else "")

    @classmethod
    def parse(cls, spec: str) -> ImageSource:
        """The source of a dataset name ``"images:PATH[?options]"`` (the inverse of :attr:`spec`; a ``?`` not
        followed by options belongs to the folder's name)."""
        path = spec.split(":", 1)[1]
        head, sep, tail = path.rpartition("?")
        pairs = parse_qsl(tail, keep_blank_values=True) if sep else []
        if pairs and all(k in _OPTIONS for k, _ in pairs):
            return cls(head, **{k: _option_value(k, v) for k, v in pairs})
        return cls(path)


_OPTIONS = ("image_size", "channels", "val_fraction", "test_fraction", "split_seed", "skip_bad", "keep_small")


def _option_value(key: str, text: str) -> Any:
    if key in ("skip_bad", "keep_small"):
        return text.lower() in ("1", "true", "yes")
    try:
        return float(text) if key.endswith("fraction") else int(text)
    except ValueError:
        raise ValueError(f"images option {key} must be a number, got {text!r}") from None


def _check_options(image_size: Any, channels: Any, val: Any, test: Any, seed: Any) -> None:
    """One line for an option no source can use."""
    if image_size is not None and (not isinstance(image_size, int) or isinstance(image_size, bool) or image_size < 1):
        raise ValueError(f"image_size must be a positive integer (pixels) or None, got {image_size!r}")
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1 (grey), 3 (RGB) or None (from the images), got {channels!r}")
    for name, value in (("val_fraction", val), ("test_fraction", test)):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
    if not val > 0:
        raise ValueError("val_fraction must be > 0: a run chooses its epoch on a validation split")
    if val + test >= 1:
        raise ValueError(f"val_fraction + test_fraction must leave training images, got {val} + {test}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"split_seed must be an integer, got {seed!r}")


# ------------------------------------------------------------------------------------------------ the folder
def _walk(folder: Path, classes: list[str], ignored: Counter) -> tuple[list[str], list[int]]:
    """torchvision's ``make_dataset`` over ``folder/<class>``: image files by extension (hidden files skipped);
    files with other extensions are counted in ``ignored``."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, has_file_allowed_extension, make_dataset

    def valid(path: str) -> bool:
        name = os.path.basename(path)
        ok = has_file_allowed_extension(name, IMG_EXTENSIONS) and not name.startswith(".")
        if not ok and not name.startswith("."):
            ignored[os.path.splitext(name)[1].lower() or "(none)"] += 1
        return ok

    samples = make_dataset(str(folder), {c: i for i, c in enumerate(classes)}, None, valid, allow_empty=True)
    return [p for p, _ in samples], [y for _, y in samples]


def _subfolders(folder: Path) -> list[str]:
    """The visible sub-folders of ``folder`` (sorted), with one line for a path that is missing or unreadable."""
    if not folder.exists():
        raise FileNotFoundError(f"{folder}: no such folder; give the folder of your images (PATH/<class>/<image>)")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder; give the folder of your images (PATH/<class>/<image>)")
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    except PermissionError:
        raise PermissionError(
            f"{folder}: cannot be read (permission denied); make it readable (chmod -R u+rX)"
        ) from None
    unreadable = [n for n in names if not os.access(folder / n, os.R_OK | os.X_OK)]
    if unreadable:
        raise PermissionError(
            f"{folder / unreadable[0]}: cannot be read (permission denied); make it readable (chmod -R u+rX)"
        )
    return names


def _classes_of(folder: Path, where: str) -> list[str]:
    classes = _subfolders(folder)
    if not classes:
        loose = any(e.is_file() for e in os.scandir(folder))
        what = "has image files but no class folders" if loose else "is empty"
        raise ValueError(f"{folder}: {what}; put each class's images in a folder of its own ({where}/<class>/<image>)")
    return classes


def _list_folder(src: ImageSource) -> dict[str, Any]:
    """The files of ``src.path``, their labels and given splits (``-1``: to be assigned), the layout, the classes
    and the files of other types ignored; every refusal in one line, before a file is read."""
    root = Path(src.path).expanduser()
    top = _subfolders(root)
    splits = [n for n in top if n.lower() in SPLIT_NAMES]
    ignored: Counter = Counter()
    if splits and len(splits) != len(top):
        others = [n for n in top if n not in splits]
        raise ValueError(
            f"{root}: mixes split folders ({', '.join(splits)}) with class folders ({', '.join(others[:3])}); put the "
            f"class folders inside {splits[0]}/ (and the other split folders), or remove the split folders"
        )
    if splits:
        if "train" not in [n.lower() for n in splits]:
            raise ValueError(f"{root}: has {', '.join(splits)} but no train/ folder; add train/<class>/<image>")
        parts = sorted(splits, key=lambda n: SPLIT_NAMES[n.lower()])
        classes = _classes_of(root / parts[0], f"{root}/{parts[0]}")
        files, labels, given = [], [], []
        for name in parts:
            own = _classes_of(root / name, f"{root}/{name}")
            if own != classes:
                diff = sorted(set(own) ^ set(classes))
                raise ValueError(
                    f"{root / name} and {root / parts[0]} have different classes ({', '.join(diff[:5])} in one "
                    f"only); give every split folder the same class folders"
                )
            f, y = _walk(root / name, classes, ignored)
            files += f
            labels += y
            given += [SPLIT_NAMES[name.lower()]] * len(f)
        layout = "split folders " + ", ".join(f"{n}/" for n in parts)
    else:
        classes = _classes_of(root, str(root))
        files, labels = _walk(root, classes, ignored)
        given = [0] * len(files)
        layout = "a folder per class"
    _check_classes(root, classes, labels, given)
    return {
        "root": root,
        "layout": layout,
        "classes": classes,
        "files": files,
        "labels": np.asarray(labels, dtype=np.int64),
        "given": np.asarray(given, dtype=np.int64),
        "ignored": dict(sorted(ignored.items())),
    }


def _check_classes(root: Path, classes: list[str], labels: list[int], given: list[int]) -> None:
    if len(classes) < 2:
        raise ValueError(
            f"{root}: one class ({classes[0]}); a classifier needs at least two class folders ({root}/<class>/<image>)"
        )
    counts = Counter(y for y, s in zip(labels, given) if s == 0)
    empty = [c for i, c in enumerate(classes) if counts[i] == 0]
    if empty:
        from torchvision.datasets.folder import IMG_EXTENSIONS

        raise ValueError(
            f"{root}: the class folder {empty[0]!r} has no training images (files ending in "
            f"{', '.join(IMG_EXTENSIONS)}); add images to it or remove it"
        )


#: content digests of the files read in this process: path -> (its stat signature, its digest), trusted only while
#: the signature is unchanged and was at least _SETTLED_NS old when the digest was taken (as git treats "racy" files)
_DIGESTS: dict[str, tuple[tuple[int, ...], str]] = {}
_SETTLED_NS = 2_000_000_000  # a file changed less than 2 s before it was hashed is hashed again next time
#: the file beside the cache that keeps the digests of settled files (each path with its stat signature and digest),
#: so that a new process stats the files instead of reading them all, for files whose signature is unchanged
DIGEST_INDEX = "file_digests.npz"
_INDEX_READ: dict[str, int] = {}  # cache folder -> the modification time of its index when this process read it
_UNSAVED: set[str] = set()  # files hashed in this process whose digests no index holds yet


def _read_index(index: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """The digests in an index file (``{}`` when it cannot be read: the files are read again)."""
    try:
        with np.load(index, allow_pickle=False) as z:
            paths, sigs, digests = z["paths"].tolist(), z["sigs"].tolist(), z["digests"].tolist()
    except (OSError, ValueError, KeyError):
        return {}
    return {p: (tuple(sig), d) for p, sig, d in zip(paths, sigs, digests)}


def load_digests(cache: Path | None) -> None:
    """The digests remembered in the cache folder's :data:`DIGEST_INDEX`, made known to :func:`file_digest` (each is
    used only while its file's stat signature, status-change time included, is the one it was taken with); an
    index that cannot be read is ignored (the files are read again)."""
    if cache is None:
        return
    try:
        stamp = (cache / DIGEST_INDEX).stat().st_mtime_ns
    except OSError:
        return
    if _INDEX_READ.get(str(cache)) == stamp:  # read already in this process, unchanged since
        return
    _INDEX_READ[str(cache)] = stamp
    for path, known in _read_index(cache / DIGEST_INDEX).items():
        _DIGESTS.setdefault(path, known)


def save_digests(cache: Path, files: list[str]) -> None:
    """Add the digests of ``files`` known in this process to the cache folder's :data:`DIGEST_INDEX` (arrays in an
    ``.npz``, written through a temporary file and a rename; not at all when each was read from an index)."""
    index = cache / DIGEST_INDEX
    if index.exists() and not _UNSAVED.intersection(files):
        return
    known = _read_index(index) if index.exists() else {}
    known.update({f: _DIGESTS[f] for f in files if f in _DIGESTS})
    cache.mkdir(parents=True, exist_ok=True)
    tmp = index.with_name(index.name + ".tmp")
    paths = list(known)
    with open(tmp, "wb") as f:
        np.savez(
            f,
            paths=np.array(paths, dtype=str),
            sigs=np.array([known[p][0] for p in paths], dtype=np.int64).reshape(len(paths), 5),
            digests=np.array([known[p][1] for p in paths], dtype=str),
        )
    os.replace(tmp, index)
    _UNSAVED.difference_update(files)


def file_digest(path: str, st: os.stat_result | None = None) -> str:
    """The BLAKE2b digest (128 bits, hex) of a file's whole content: what keys the image cache. Within a process a
    file is read again only when its size, modification or status-change time, inode or device changed (an
    in-place write changes the status-change time even when the modification time is set back), or when it had
    changed within 2 s of being hashed (timestamps are coarse: such a file is always read again)."""
    st = st or os.stat(path)
    sig = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    known = _DIGESTS.get(path)
    if known is not None and known[0] == sig:
        return known[1]
    now = time.time_ns()
    h = hashlib.blake2b(digest_size=16)
    fd = os.open(path, os.O_RDONLY)  # os.read: a third cheaper than open() for 50,000 small files
    try:
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    digest = h.hexdigest()
    if now - max(st.st_mtime_ns, st.st_ctime_ns) >= _SETTLED_NS:
        _DIGESTS[path] = (sig, digest)
        _UNSAVED.add(path)
    else:
        _DIGESTS.pop(path, None)
    return digest


def _key(src: ImageSource, listing: dict[str, Any], size: int) -> str:
    """The folder's fingerprint for its cache: every file's path (relative), label, given split, size and content
    (:func:`file_digest`: pixels edited in place, even with the same size and modification time, give another
    key), the options that change the pixels and the cache format."""
    h = hashlib.sha256(repr((size, src.channels, src.skip_bad, listing["classes"])).encode())
    cut = len(os.path.join(str(listing["root"]), ""))  # the listing's paths are the folder's path joined with theirs
    for path, y, s in zip(listing["files"], listing["labels"], listing["given"]):
        st = os.stat(path)
        h.update(f"{path[cut:]}\t{y}\t{s}\t{st.st_size}\t{file_digest(path, st)}\n".encode())
    return h.hexdigest()


def _decide_size(src: ImageSource, files: list[str]) -> tuple[int, str]:
    """The image side and the one-line rule that chose it (from the headers of up to ``_SAMPLE`` files)."""
    if src.image_size is not None:
        return src.image_size, f"{src.image_size} x {src.image_size} (image_size)"
    from PIL import Image

    sides = []
    for i in np.linspace(0, len(files) - 1, min(_SAMPLE, len(files))).round().astype(int):
        try:
            with Image.open(files[i]) as im:
                sides.append(min(im.size))
        except (OSError, SyntaxError, ValueError) as e:
            if not src.skip_bad:
                raise ValueError(
                    f"{files[i]}: not an image or damaged ({type(e).__name__}); delete or replace it, or skip such "
                    f"files (--skip-bad-files, skip_bad=True: how many were skipped is reported)"
                ) from None
    if not sides:
        raise ValueError(f"{src.path}: none of the files sampled is an image PIL can read")
    common = Counter(sides).most_common(1)[0][0]
    size = min(common, MAX_CACHED_SIDE)
    why = f"the most common shorter side of {len(sides)} files sampled" + (
        f" ({common}), at most {MAX_CACHED_SIDE}" if common > MAX_CACHED_SIDE else ""
    )
    return size, f"{size} x {size} ({why})"


def _version() -> str:
    """The installed capsule_lib's version (what a cache records; another version's cache is rebuilt)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("capsule_lib")
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "source"


def _read_folder(src: ImageSource, listing: dict[str, Any], size: int, key: str, cache: Path | None) -> dict:
    """The folder's pixels: from the cache when it holds them, else decoded in worker processes (the cache is
    written later, when the images are used: :mod:`capsule_lib.data.images`); for images larger than
    ``MAX_CACHED_SIDE``, the files to read while training. ``cached`` names the cache file when it was read."""
    files = listing["files"]
    if size > MAX_CACHED_SIDE:  # read while training: channels from the headers, nothing decoded now
        from PIL import Image

        grey = resized = upsampled = 0
        for path in files:
            with Image.open(path) as im:
                grey += im.mode in GREY_MODES
                resized += im.size != (size, size)
                upsampled += min(im.size) * MAX_UPSAMPLE < size
        channels = src.channels or (1 if grey == len(files) else 3)
        keep = torch.ones(len(files), dtype=torch.bool)
        images = FileImages(files, size, channels, key)
        n_grey = grey if channels == 3 else 0
        n_colour = len(files) - grey if channels == 1 else 0
        return {
            "images": images,
            "keep": keep,
            "grey": n_grey,
            "colour": n_colour,
            "resized": resized,
            "upsampled": upsampled,
            "bad": [],
            "stored": "read from the files while training (worker processes)",
            "cached": None,
        }
    path = cache / f"{key[:20]}.pt" if cache is not None else None
    hit = load_cache(path, key, _version()) if path is not None else None
    if hit is not None:
        fields = ("images", "keep", "grey", "colour", "resized")
        done = Decoded(*(hit[k] for k in fields), list(hit["bad"]), int(hit.get("upsampled", 0)))
        stored = f"decoded images read from the cache {path.name}"
    else:
        done = decode_files(files, size, src.channels, skip_bad=src.skip_bad)
        stored = "decoded now (in worker processes)" if len(files) >= 2000 else "decoded now"
    return {**vars(done), "stored": stored, "cached": path if hit is not None else None}
