"""The reader's own images, behind :func:`~capsule_lib.data.get_dataset` like the named datasets: a folder in
torchvision's ``ImageFolder`` layout (``dataset="images:PATH"``) or tensors already in memory
(:func:`register_images`, then ``dataset=<its name>``). Every recipe that reads image datasets trains on them
(``train("capsnet", dataset="images:photos")``, ``python -m capsule_lib.train capsnet --images photos``).

Decided once, recorded in the run (``history.meta["images"]``) and said in one line:

* **layout**: ``PATH/<class>/<image>`` (class names: the folder names, sorted), or ``PATH/train/<class>/...`` with
  ``val/`` and ``test/`` beside it (kept as given; the classes must be the same in each);
* **splits**: what the folder does not give is taken from each class's training images at random (``val_fraction``
  and ``test_fraction``, default 0.1 each; ``split_seed``, default 0): the same files every time;
* **size**: ``image_size``, else the most common shorter side of up to 256 files sampled evenly, at most
  :data:`~capsule_lib.data.image_files.MAX_CACHED_SIDE` (64: capsule networks grow with the square of it); each
  image's shorter side is resized to it and the middle square kept (the number of images this changed is counted);
* **channels**: ``channels`` (1 or 3), else grey when every file is grey, else RGB (grey files repeated to RGB and
  counted); RGBA and palette files are converted to RGB by PIL, as ``ImageFolder``'s loader does;
* **normalisation**: the per-channel mean and standard deviation of the training split, recorded, and given to the
  networks that normalise inside (Tsai et al.'s and its backbone baseline: ``input_mean``, ``input_std``); the
  others read images in [0, 1] as they do in the chapters (CapsNet and Efficient-CapsNet reconstruct them).

Images up to 64 x 64 are decoded once, in worker processes, into a ``uint8`` tensor; when the
:class:`~capsule_lib.data.DataSource` names a ``cache`` folder (:func:`~capsule_lib.train.run.train` gives the
folder ``image_cache`` next to the run), they are kept there in a file keyed by a fingerprint of the files (names,
sizes, modification times) and the options, and read back on the next run; a cache of another version or of other
images is rebuilt, not trusted. Larger images are read batch by batch while training
(:class:`~capsule_lib.data.image_files.FileImages`, :class:`~capsule_lib.data.loaders.StreamLoader`).

Bad input is refused in one line that names the file or folder and the fix, before anything is written: a path that
does not exist or cannot be read, an empty folder, one class, a class folder without images, split folders whose
classes differ, a file that is not an image or is truncated (``skip_bad=True`` leaves such files out and counts
them). The network's smallest image is checked by the recipe
(:meth:`~capsule_lib.train.recipes.base.Recipe.fit_to_images`).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._contracts import checked
from .datasets import _REGISTRY, DataSource, ImageDataset, register_dataset
from .image_files import MAX_CACHED_SIDE, MAX_UPSAMPLE, FileImages, save_cache
from .image_folder import (
    _OPTIONS,
    IMAGES,
    ImageSource,
    _check_classes,
    _check_options,
    _decide_size,
    _key,
    _list_folder,
    _read_folder,
    _version,
    load_digests,
    save_digests,
)

__all__ = ["ImageFacts", "image_facts", "register_images", "describe_images", "cache_folder"]

_SPLITS = ("train", "val", "test")
_MEMORY: dict[str, dict[str, Any]] = {}  # register_images: name -> its prepared images
_LOADED: dict[str, dict[str, Any]] = {}  # folders read in this process, by key (the last two)


@dataclass(frozen=True)
class ImageFacts:
    """What a recipe needs of the reader's images before it builds its network
    (:meth:`~capsule_lib.train.recipes.base.Recipe.fit_to_images`).

    Attributes
    ----------
    where : str
        The folder (or the in-memory set's name), for messages.
    classes : list of str
        Class names, in label order.
    channels : int
        1 or 3.
    image_size : int
        The side of every image.
    mean : list of float
        Per channel, over the training split (values in [0, 1]).
    std : list of float
        Per channel, over the training split.
    record : dict
        Every decision (the run records it as ``history.meta["images"]``).
    """

    where: str
    classes: list[str]
    channels: int
    image_size: int
    mean: list[float]
    std: list[float]
    record: dict[str, Any] = field(default_factory=dict)


def _assign(labels: np.ndarray, given: np.ndarray, val: float, test: float, seed: int) -> np.ndarray:
    """Split ids (0 train, 1 val, 2 test): the given ones, and for the training files, in each class, the first
    ``round(val * n)`` / ``round(test * n)`` of a seeded permutation held out where the folder has no such split
    (at least one each for a class of three images or more; each class keeps at least one training image)."""
    split = given.copy()
    g = np.random.default_rng(seed)
    need_val, need_test = not (given == 1).any(), not (given == 2).any()
    for k in np.unique(labels):
        idx = np.flatnonzero((labels == k) & (given == 0))
        idx = idx[g.permutation(len(idx))]
        small = 1 if len(idx) >= 3 else 0  # a class of 3 or more gives each held-out split one image at least
        n_val = max(int(round(val * len(idx))), small) if need_val else 0
        n_test = max(int(round(test * len(idx))), small if test > 0 else 0) if need_test else 0
        while n_val + n_test >= len(idx) and n_val + n_test > 0:  # keep one training image
            n_test, n_val = (n_test - 1, n_val) if n_test >= n_val else (n_test, n_val - 1)
        split[idx[:n_val]] = 1
        split[idx[n_val : n_val + n_test]] = 2
    return split


def _class_splits(
    labels: Any, split: Any, held: tuple[bool, bool], classes: list[str], where: str, keep_small: bool
) -> tuple[dict[str, list[int]], list[str]]:
    """Each class's ``[train, val, test]`` counts, and the classes kept without a validation or a test image
    (``keep_small``); without it, such a class is refused in one line naming it, its images and what it needs.
    ``held``: whether the validation / test images are held out of the training files (else given by folders)."""
    labels, split = np.asarray(labels), np.asarray(split)
    counts = {c: [int(((labels == k) & (split == s)).sum()) for s in range(3)] for k, c in enumerate(classes)}
    small = [c for c, n in counts.items() if n[1] == 0 or n[2] == 0]
    if small and not keep_small:
        c, n = small[0], counts[small[0]]
        need = 1 + sum(held) + sum(1 for s, h in zip(n[1:], held) if not h and s == 0)
        given = [f"{name}/" for name, s, h in zip(("val", "test"), n[1:], held) if not h and s == 0]
        fix = f"add images to it ({', '.join(given)} included)" if given else "add images to it"
        raise ValueError(
            f"{where}: the class {c!r} has {sum(n)} image{'s' * (sum(n) != 1)} ({n[0]} train / {n[1]} val / {n[2]} "
            f"test), too few to give a validation and a test image: it needs at least {need}; {fix}, remove it, "
            f"or keep it untested (--keep-small-classes, keep_small=True: said in the summary)"
        )
    return counts, small


def _load_folder(src: ImageSource, cache: Path | None = None) -> tuple[str, dict[str, Any]]:
    """The listing, the decisions and the pixels of a folder (memoised in this process by its key; the files'
    digests remembered in ``cache`` are used where their files are unchanged)."""
    listing = _list_folder(src)
    split = _assign(listing["labels"], listing["given"], src.val_fraction, src.test_fraction, src.split_seed)
    held = (not (listing["given"] == 1).any(), not (listing["given"] == 2).any())
    _class_splits(listing["labels"], split, held, listing["classes"], str(listing["root"]), src.keep_small)
    size, size_rule = _decide_size(src, listing["files"])
    load_digests(cache)
    key = _key(src, listing, size)
    memo = f"{key}:{src.val_fraction}:{src.test_fraction}:{src.split_seed}:{src.keep_small}"
    return memo, {
        "listing": listing,
        "size": size,
        "size_rule": size_rule,
        "split": split,
        "key": key,
        "held": held,
    }


def _folder(src: ImageSource, cache: Path | None, say: bool = True) -> dict[str, Any]:
    memo, plan = _load_folder(src, cache)
    if memo in _LOADED:
        return _LOADED[memo]
    listing = plan["listing"]
    read = _read_folder(src, listing, plan["size"], plan["key"], cache)
    keep = read["keep"].numpy()
    files = [f for f, k in zip(listing["files"], keep) if k]
    split = plan["split"][keep]
    if not keep.all():  # files skipped as unreadable: the held-out images are chosen among the readable ones
        split = _assign(
            listing["labels"][keep], listing["given"][keep], src.val_fraction, src.test_fraction, src.split_seed
        )
    root = listing["root"]
    record = {
        "source": src.path,
        "options": {k: getattr(src, k) for k in _OPTIONS},
        "layout": listing["layout"],
        "files": len(files),
        "ignored": listing["ignored"],
        "skipped": len(read["bad"]),
        "skipped_files": [os.path.relpath(f, root) for f, _ in read["bad"][:10]],
        "size_rule": plan["size_rule"],
        "resized": read["resized"],
        "upsampled": read["upsampled"],
        "grey_to_rgb": read["grey"],
        "colour_to_grey": read["colour"],
        "stored": read["stored"],
    }
    data = _prepare(
        read["images"],
        torch.from_numpy(listing["labels"][keep]),
        torch.from_numpy(split),
        listing["classes"],
        record,
        str(root),
        files,
        held=plan["held"],
        keep_small=src.keep_small,
    )
    data["key"], data["read"] = plan["key"], read  # what a cache file holds (written when the data is used)
    data["cached"] = {str(read["cached"])} if read["cached"] is not None else set()  # cache files known good
    data["indexed"] = set()  # cache folders whose digest index holds these files
    read["files"] = listing["files"]
    _LOADED[memo] = data
    if say:  # once per folder and process: what was decided (train() says it with the network it became)
        print(describe_images(data["record"]), flush=True)
    while len(_LOADED) > 2:  # the last two folders read
        _LOADED.pop(next(iter(_LOADED)))
    return data


def _stats(images: Any, index: torch.Tensor) -> tuple[list[float], list[float], int]:
    """Per-channel mean and standard deviation in [0, 1] of ``images[index]`` (all of them, or up to 512 files read
    for images read while training), and how many images that was."""
    if isinstance(images, FileImages):
        index = index[torch.linspace(0, len(index) - 1, min(512, len(index))).round().long()]
        images = images.load(index)
        index = torch.arange(images.shape[0])
    total = torch.zeros(images.shape[1], dtype=torch.int64)  # sums of uint8 values, exact in integers
    squares = torch.zeros_like(total)
    for lo in range(0, len(index), 4096):
        x = images[index[lo : lo + 4096]].to(torch.int32)  # [n, C, S, S], 0..255
        total += x.sum((0, 2, 3), dtype=torch.int64)
        squares += (x * x).sum((0, 2, 3), dtype=torch.int64)
    n = len(index) * images.shape[2] * images.shape[3]
    mean = total.double() / (255.0 * n)
    std = (squares.double() / (255.0**2 * n) - mean * mean).clamp_min(0).sqrt()
    return [round(float(v), 4) for v in mean], [round(float(v), 4) for v in std], len(index)


def _prepare(
    images: Any,
    labels: torch.Tensor,
    split: torch.Tensor,
    classes: list[str],
    record: dict,
    where: str,
    files: list[str] | None = None,
    *,
    held: tuple[bool, bool] = (True, True),
    keep_small: bool = False,
) -> dict[str, Any]:
    """The splits of prepared images (``uint8 [N, C, S, S]`` or :class:`FileImages`) and the complete record
    (each class's split sizes; a class without a validation or a test image refused unless ``keep_small``)."""
    per_class, small = _class_splits(labels.numpy(), split.numpy(), held, classes, where, keep_small)
    sizes = {name: int((split == k).sum()) for k, name in enumerate(_SPLITS)}
    empty = [name for name in ("val", "test") if sizes[name] == 0]
    if empty:
        raise ValueError(
            f"{where}: no {empty[0]} images ({sizes['train']} training images over {len(classes)} classes are too "
            f"few for {empty[0]}_fraction); add images, raise {empty[0]}_fraction, or give a {empty[0]}/ folder"
        )
    mean, std, counted = _stats(images, torch.nonzero(split == 0).squeeze(1))
    record = {
        **record,
        "classes": list(classes),
        "image_size": int(images.shape[-1]),
        "channels": int(images.shape[1]),
        "split_sizes": sizes,
        "class_split_sizes": per_class,
        "small_classes_kept": small,
        "mean": mean,
        "std": std,
        "normalisation": f"per-channel mean and std of {counted:,} training images",
    }
    return {
        "images": images,
        "labels": labels,
        "split": split,
        "classes": list(classes),
        "record": record,
        "where": where,
        "files": files,
    }


# ------------------------------------------------------------------------------------------- tensors in memory
def _as_uint8_images(images: Any, name: str) -> torch.Tensor:
    """``[N, C, H, W]`` / ``[N, H, W]`` / ``[N, H, W, C]`` (C 1, 3 or 4), uint8 or float in [0, 1] -> ``uint8
    [N, C, H, W]`` (C 1 or 3: an alpha channel is dropped)."""
    x = torch.as_tensor(np.asarray(images)) if not isinstance(images, torch.Tensor) else images.detach().cpu()
    if x.dim() == 3:
        x = x[:, None]
    if x.dim() != 4 or x.shape[0] == 0:
        raise ValueError(f"register_images({name!r}): images must be [N, C, H, W] with N > 0, got {tuple(x.shape)}")
    if x.shape[1] not in (1, 3, 4) and x.shape[3] in (1, 3, 4):
        x = x.permute(0, 3, 1, 2)  # [N, H, W, C], as PIL and numpy arrays hold images
    if x.shape[1] not in (1, 3, 4):
        raise ValueError(f"register_images({name!r}): images need 1 (grey) or 3 (RGB) channels, got {tuple(x.shape)}")
    x = x[:, :3]
    if x.dtype == torch.uint8:
        return x.contiguous()
    if not x.is_floating_point() or not torch.isfinite(x).all() or x.min() < 0 or x.max() > 1:
        raise ValueError(f"register_images({name!r}): images must be uint8, or floats in [0, 1] (got {x.dtype})")
    return (x.float() * 255).round().to(torch.uint8).contiguous()


@checked
def register_images(
    name: str,
    images: Any,
    labels: Any,
    classes: list[str],
    *,
    test: tuple[Any, Any] | None = None,
    image_size: int | None = None,
    channels: int | None = None,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    keep_small: bool = False,
) -> str:
    """Register images held in memory as the dataset ``name`` of :func:`~capsule_lib.data.get_dataset` (and so of
    every recipe: ``train("capsnet", dataset=name)``), decided as a folder is (the module docstring).

    Parameters
    ----------
    name : str
        The dataset's name (not one of the library's datasets; registering it again replaces it).
    images : torch.Tensor or numpy.ndarray
        ``[N, C, H, W]``, ``[N, H, W]`` or ``[N, H, W, C]`` (C 1, 3, or 4: alpha dropped), uint8 or float in [0, 1].
    labels : torch.Tensor or numpy.ndarray
        ``[N]`` class indices ``0 .. len(classes) - 1``.
    classes : list of str
        Class names, in label order (at least two).
    test : tuple, optional
        ``(images, labels)`` of a test split of its own (else ``test_fraction`` of each class is held out).
    image_size, channels, val_fraction, test_fraction, split_seed, keep_small
        As :class:`ImageSource`'s (``image_size`` ``None``: the images' shorter side, at most 64).

    Returns
    -------
    str
        ``name``.
    """
    _check_options(image_size, channels, val_fraction, test_fraction if test is None else 0.0, split_seed)
    if name in _REGISTRY and name not in _MEMORY:
        raise ValueError(f"register_images: {name!r} is one of the library's datasets; choose another name")
    if ":" in name or not name:
        raise ValueError(f"register_images: name must be a non-empty name without ':', got {name!r}")
    classes = [str(c) for c in classes]
    if len(classes) < 2 or len(set(classes)) != len(classes):
        raise ValueError(f"register_images({name!r}): classes must be two or more distinct names, got {classes}")
    parts = [(images, labels, 0)] + ([(test[0], test[1], 2)] if test is not None else [])
    xs, ys, given = [], [], []
    for x, y, s in parts:
        x = _as_uint8_images(x, name)
        y = torch.as_tensor(np.asarray(y)).long().reshape(-1)
        if y.shape[0] != x.shape[0] or (y.numel() and (y.min() < 0 or y.max() >= len(classes))):
            raise ValueError(
                f"register_images({name!r}): labels must be [N] class indices 0..{len(classes) - 1} for "
                f"{x.shape[0]} images, got shape {tuple(y.shape)}"
            )
        xs.append(x)
        ys.append(y)
        given.append(torch.full_like(y, s))
    record, x = _fit_tensors(xs, image_size, channels)
    y, given = torch.cat(ys), torch.cat(given)
    _check_classes(Path(name), classes, y.tolist(), given.tolist())
    split = torch.from_numpy(_assign(y.numpy(), given.numpy(), val_fraction, test_fraction, split_seed))
    record.update(source=f"memory:{name}", layout="tensors in memory", files=int(x.shape[0]), stored="in memory")
    record["options"] = {
        "image_size": image_size,
        "channels": channels,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "split_seed": split_seed,
        "skip_bad": False,
        "keep_small": keep_small,
    }
    held = (True, test is None)
    _MEMORY[name] = _prepare(x, y, split, classes, record, name, held=held, keep_small=keep_small)
    print(describe_images(_MEMORY[name]["record"]), flush=True)
    register_dataset(name)(functools.partial(_memory_dataset, name=name))
    return name


def _fit_tensors(xs: list[torch.Tensor], image_size: int | None, channels: int | None) -> tuple[dict, torch.Tensor]:
    """Resize (shorter side, then the middle square) and convert channels as a folder's files are."""
    from torchvision.transforms.v2.functional import center_crop, resize, rgb_to_grayscale

    side = min(min(x.shape[-2:]) for x in xs)
    size = image_size or min(side, MAX_CACHED_SIDE)
    rule = f"{size} x {size} (" + (
        "image_size)" if image_size else f"the images' shorter side, at most {MAX_CACHED_SIDE})"
    )
    colour = max(x.shape[1] for x in xs) == 3
    c = channels or (3 if colour else 1)
    record = {"size_rule": rule, "resized": 0, "upsampled": 0, "grey_to_rgb": 0, "colour_to_grey": 0, "skipped": 0}
    record["ignored"] = {}
    out = []
    for x in xs:
        if min(x.shape[-2:]) * MAX_UPSAMPLE < size:
            record["upsampled"] += x.shape[0]
        if tuple(x.shape[-2:]) != (size, size):
            record["resized"] += x.shape[0]
            x = center_crop(resize(x, size, antialias=True), size)
        if x.shape[1] != c:
            record["grey_to_rgb" if c == 3 else "colour_to_grey"] += x.shape[0]
            x = x.repeat(1, 3, 1, 1) if c == 3 else rgb_to_grayscale(x)
        out.append(x)
    return record, torch.cat(out)


def _memory_dataset(root: Path, split: str, download: bool, *, name: str = "", **_: Any) -> ImageDataset:
    return _split_dataset(_MEMORY[name], name, split)


# ------------------------------------------------------------------------------------------------ get_dataset
def _split_dataset(data: dict[str, Any], name: str, split: str) -> ImageDataset:
    """One split, its images in a seeded order (``split_seed``; files come class by class, so that the first ``n``
    of a split, ``train_subset=n``, hold every class)."""
    from .._checks import check_choice

    check_choice(split, ("train", "val", "test", "train_full"), "split")
    ids = (0, 1) if split == "train_full" else (_SPLITS.index(split),)
    index = torch.nonzero(torch.isin(data["split"], torch.tensor(ids))).squeeze(1)
    record = data["record"]
    seed = torch.Generator().manual_seed(int(record["options"]["split_seed"]))
    index = index[torch.randperm(len(index), generator=seed)]
    return ImageDataset(
        name,
        split,
        data["images"][index],
        data["labels"][index],
        data["classes"],
        description=describe_images(record),
        extra={"images": record},
    )


@register_dataset(IMAGES)
def _folder_dataset(
    root: Path, split: str, download: bool, *, argument: str = "", source: Any = None, **_: Any
) -> ImageDataset:
    """``get_dataset("images:PATH[?options]", source, split)``: the folder's split; its decoded images are written to
    the source's cache folder now (once per process and file), when it names one and they were not read from there."""
    src = ImageSource.parse(f"{IMAGES}:{argument}")
    data = _folder(src, getattr(source, "cache", None))
    cache = getattr(source, "cache", None)
    path = cache / f"{data['key'][:20]}.pt" if cache is not None else None
    if path is not None and isinstance(data["images"], torch.Tensor) and str(path) not in data["cached"]:
        save_cache(
            path,
            data["key"],
            _version(),
            {k: data["read"][k] for k in ("images", "keep", "grey", "colour", "resized", "upsampled", "bad")},
        )
        data["cached"].add(str(path))
    if cache is not None and str(cache) not in data["indexed"]:  # the files' digests, for the next process
        save_digests(cache, data["read"]["files"])
        data["indexed"].add(str(cache))
    return _split_dataset(data, src.spec, split)


@checked
def image_facts(name: str, source: DataSource | None = None, say: bool = True) -> ImageFacts | None:
    """What :meth:`~capsule_lib.train.recipes.base.Recipe.fit_to_images` needs of the dataset ``name`` when it is
    the reader's images (``"images:PATH"`` or a name given to :func:`register_images`); ``None`` for the library's
    datasets. A folder is read here (its files decoded, or its cache read) but no cache is written yet.

    Parameters
    ----------
    name : str
        A recipe's ``dataset``.
    source : DataSource, optional
        Where its cache is (``source.cache``).
    say : bool, optional
        Print the folder's decisions (:func:`describe_images`) when it is read in this process (default); ``False``
        for a caller that says them itself (:func:`~capsule_lib.train.train`, with the network they gave).

    Returns
    -------
    ImageFacts or None
        Classes, channels, side, the training split's mean and std, and the whole record.
    """
    if name.startswith(f"{IMAGES}:"):
        data = _folder(ImageSource.parse(name), getattr(source, "cache", None), say)
    elif name in _MEMORY:
        data = _MEMORY[name]
    else:
        return None
    r = data["record"]
    return ImageFacts(data["where"], r["classes"], r["channels"], r["image_size"], r["mean"], r["std"], r)


def describe_images(record: dict[str, Any]) -> str:
    """The decisions of a record in one line (what a run prints and its history keeps)."""
    classes = record["classes"]
    names = ", ".join(classes[:6]) + (f", ... ({len(classes)})" if len(classes) > 6 else f" ({len(classes)})")
    sizes = record["split_sizes"]
    opts = record["options"]
    held = f"val {opts['val_fraction']:g}, test {opts['test_fraction']:g} of each class, seed {opts['split_seed']}"
    changed = [
        f"{record['resized']:,} resized" if record.get("resized") else "",
        f"{record['upsampled']:,} of them enlarged more than {MAX_UPSAMPLE}x" if record.get("upsampled") else "",
        f"{record['grey_to_rgb']:,} grey converted to RGB" if record.get("grey_to_rgb") else "",
        f"{record['colour_to_grey']:,} colour converted to grey" if record.get("colour_to_grey") else "",
        f"{record['skipped']:,} unreadable skipped" if record.get("skipped") else "",
        f"{sum(record['ignored'].values()):,} other files ignored" if record.get("ignored") else "",
    ]
    changed = "; ".join(c for c in changed if c) or "no image changed"
    mean = ", ".join(f"{v:.3f}" for v in record["mean"])
    std = ", ".join(f"{v:.3f}" for v in record["std"])
    return (
        f"[your images] {record['source']}: {record['layout']}; classes {names}; {record['files']:,} images at "
        f"{record['size_rule']}, {'RGB' if record['channels'] == 3 else 'grey'} ({changed}); train / val / test "
        f"{sizes['train']:,} / {sizes['val']:,} / {sizes['test']:,} ({held} where not given){_per_class(record)}; "
        f"mean ({mean}), std ({std}) of the training split; {record['stored']}"
    )


def _per_class(record: dict[str, Any]) -> str:
    """Each class's train / val / test counts (up to 8 classes; beyond, their ranges and the smallest class), and
    the small classes kept without a validation or test image."""
    counts = record.get("class_split_sizes")
    if not counts:
        return ""  # a record written before the counts were kept
    if len(counts) <= 8:
        text = ", per class " + ", ".join(f"{c} {'/'.join(map(str, n))}" for c, n in counts.items())
    else:
        lo = [min(n[s] for n in counts.values()) for s in range(3)]
        hi = [max(n[s] for n in counts.values()) for s in range(3)]
        fewest = min(counts, key=lambda c: sum(counts[c]))
        text = ", per class " + " / ".join(f"{a:,}-{b:,}" for a, b in zip(lo, hi))
        text += f" (fewest: {fewest} {'/'.join(map(str, counts[fewest]))})"
    small = record.get("small_classes_kept") or []
    if small:
        text += f"; kept without a validation or test image (keep_small): {', '.join(small)}"
    return text


def cache_folder(out_dir: str | os.PathLike) -> Path:
    """The folder of the decoded-images cache of a run in ``out_dir``: ``image_cache`` next to it (shared by the runs
    of one parent folder; what :func:`~capsule_lib.train.run.train` and the command line both read and write)."""
    return Path(out_dir).expanduser().parent / "image_cache"
