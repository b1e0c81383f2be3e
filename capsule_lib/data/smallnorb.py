"""smallNORB (LeCun, Huang & Bottou 2004): the binary matrix format, the loader and each paper's preprocessing.

**File format** (https://cs.nyu.edu/~ylclab/data/norb-v1.0-small/; also TensorFlow Datasets' reader):
little-endian; ``int32 magic`` (element type: ``0x1E3D4C55`` byte/uint8, ``0x1E3D4C54`` int32,
``0x1E3D4C56`` int16, ``0x1E3D4C51`` float32, ``0x1E3D4C53`` float64; ``0x1E3D4C52`` "packed" is never
used and not supported), ``int32 ndim``, then ``max(3, ndim)`` ``int32`` dimensions (unused ones are 1),
then the data in C order. The six files of the small set::

    smallnorb-5x46789x9x18x6x2x96x96-training-{dat,cat,info}.mat(.gz)   instances 4, 6, 7, 8, 9
    smallnorb-5x01235x9x18x6x2x96x96-testing-{dat,cat,info}.mat(.gz)    instances 0, 1, 2, 3, 5

``dat``: uint8 ``[24300, 2, 96, 96]`` (stereo pairs); ``cat``: int32 ``[24300]`` category 0-4 (animal,
human, airplane, truck, car); ``info``: int32 ``[24300, 4]`` = instance 0-9, elevation index 0-8
(30-70 degrees, step 5), azimuth 0, 2, ..., 34 (times 10 degrees), lighting 0-5. The loader stores the
azimuth as an index 0-17 (raw / 2, as TensorFlow Datasets does).

**Preprocessing** of the capsule papers, as batched transforms on ``[B, 2, 96, 96]`` float tensors
(see each function): Heinsen 2019 (:func:`heinsen_transform`: ±16 px edge-padded random shifts on the
96×96 pair, plus two coordinate channels), Efficient-CapsNet (:class:`EfficientNorbTransform`: per-split
standardisation, resize to 64, random crop 48 + random brightness/contrast for training, centre crop 48 for
testing) and Hinton et al. 2018 as in the public EM-routing code (:func:`hinton_transform`: resize 48,
random crop 32 + brightness/contrast jitter for training, centre crop 32 for testing).
"""
from __future__ import annotations

import gzip
import io
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..functional import add_coordinate_channels
from .datasets import ImageDataset, _check_split, register_dataset, train_val_indices, unavailable

__all__ = [
    "NORB_MAGIC", "NorbFormatError", "read_norb_matrix", "write_norb_matrix", "parse_norb_matrix",
    "norb_files", "load_smallnorb_arrays", "SMALLNORB_CLASSES", "shift_edge",
    "heinsen_transform", "channel_stats", "EfficientNorbTransform", "hinton_transform", "stereo_as_samples",
]

NORB_MAGIC = {
    0x1E3D4C51: np.dtype("<f4"),   # single precision matrix
    0x1E3D4C53: np.dtype("<f8"),   # double precision matrix
    0x1E3D4C54: np.dtype("<i4"),   # integer matrix
    0x1E3D4C55: np.dtype("u1"),    # byte matrix
    0x1E3D4C56: np.dtype("<i2"),   # short matrix
}
_PACKED = 0x1E3D4C52
SMALLNORB_CLASSES = ["animal", "human", "airplane", "truck", "car"]
_PREFIX = {"train": "smallnorb-5x46789x9x18x6x2x96x96-training", "test": "smallnorb-5x01235x9x18x6x2x96x96-testing"}
_N = 24300


class NorbFormatError(ValueError):
    """A file is not a valid NORB binary matrix (bad magic, dimensions or length)."""


def parse_norb_matrix(data: bytes | bytearray | memoryview, name: str = "<bytes>") -> np.ndarray:
    """Parse the bytes of a NORB binary matrix into a numpy array (a view of ``data``); :class:`NorbFormatError`
    naming ``name`` and what was expected if the header or length is wrong."""
    if len(data) < 8:
        raise NorbFormatError(f"{name}: truncated NORB matrix: {len(data)} bytes, a header needs at least 20")
    magic, ndim = struct.unpack("<ii", bytes(data[:8]))
    if magic == _PACKED:
        raise NorbFormatError(f"{name}: 'packed' NORB matrices (magic 0x1E3D4C52) are not supported")
    if magic not in NORB_MAGIC:
        raise NorbFormatError(f"{name}: bad magic number 0x{magic & 0xFFFFFFFF:08X}; expected one of "
                              + ", ".join(f"0x{m:08X}" for m in NORB_MAGIC) + " (is this a NORB .mat file?)")
    if not 0 <= ndim <= 16:
        raise NorbFormatError(f"{name}: implausible number of dimensions {ndim}")
    header = 8 + 4 * max(3, ndim)
    if len(data) < header:
        raise NorbFormatError(f"{name}: truncated header: {len(data)} bytes, expected {header}")
    dims = struct.unpack(f"<{max(3, ndim)}i", bytes(data[8:header]))[:ndim]
    if any(d < 0 for d in dims):
        raise NorbFormatError(f"{name}: negative dimension in {dims}")
    dtype = NORB_MAGIC[magic]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    found = len(data) - header
    if found != expected:
        kind = "truncated" if found < expected else "too long"
        raise NorbFormatError(f"{name}: {kind}: shape {tuple(dims)} of {dtype.name} needs {expected} data bytes "
                              f"after the {header}-byte header, found {found}")
    return np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)


def read_norb_matrix(path: str | os.PathLike) -> np.ndarray:
    """Read a NORB binary matrix file (``.mat`` or ``.mat.gz``) into a numpy array (native byte order)."""
    p = Path(path)
    try:
        if p.suffix == ".gz":
            buf = io.BytesIO()
            with gzip.open(p, "rb") as f:
                shutil.copyfileobj(f, buf, 1 << 22)
            data = buf.getbuffer()  # writable view, no extra copy
        else:
            data = bytearray(p.stat().st_size)
            with open(p, "rb") as f:
                f.readinto(data)
    except (OSError, EOFError) as e:  # gzip: truncated stream / bad CRC / not gzip
        raise NorbFormatError(f"{p}: cannot read ({type(e).__name__}: {e})") from e
    arr = parse_norb_matrix(data, str(p))
    return arr.astype(arr.dtype.newbyteorder("="), copy=False)


def write_norb_matrix(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` (uint8, int16, int32, float32 or float64) as a NORB binary matrix (gzip if the name
    ends in ``.gz``), atomically (temporary name, then rename)."""
    a = np.asarray(array)
    inv = {(v.kind, v.itemsize): k for k, v in NORB_MAGIC.items()}
    magic = inv.get((a.dtype.kind, a.dtype.itemsize))
    if magic is None:
        raise ValueError(f"dtype {a.dtype} has no NORB magic number")
    dims = list(a.shape) + [1] * max(0, 3 - a.ndim)
    blob = struct.pack(f"<ii{len(dims)}i", magic, a.ndim, *dims) + np.ascontiguousarray(a, NORB_MAGIC[magic]).tobytes()
    p = Path(path)
    tmp = p.with_name(p.name + f".tmp{os.getpid()}")
    try:
        if p.suffix == ".gz":
            with gzip.open(tmp, "wb") as f:
                f.write(blob)
        else:
            tmp.write_bytes(blob)
        os.replace(tmp, p)
    finally:
        if tmp.exists():
            tmp.unlink()


def norb_files(folder: Path, part: str) -> dict[str, Path | None]:
    """The ``dat``/``cat``/``info`` files of ``part`` ("train"/"test") in ``folder`` (``.mat`` preferred
    over ``.mat.gz``), ``None`` where missing."""
    out: dict[str, Path | None] = {}
    for kind in ("dat", "cat", "info"):
        stem = folder / f"{_PREFIX[part]}-{kind}.mat"
        out[kind] = stem if stem.exists() else (stem.with_name(stem.name + ".gz") if stem.with_name(stem.name + ".gz").exists() else None)
    return out


def load_smallnorb_arrays(folder: Path, part: str, expected: int | None = _N) -> dict[str, np.ndarray]:
    """Parse and cross-check the three files of ``part``: ``images`` uint8 ``[N, 2, 96, 96]``,
    ``category``, ``instance``, ``elevation`` (0-8), ``azimuth`` (index 0-17), ``lighting`` (0-5), int64 ``[N]``.
    ``expected``: the number of pairs required (24,300 for the official files; ``None`` skips the check)."""
    files = norb_files(folder, part)
    missing = [f"{_PREFIX[part]}-{k}.mat(.gz)" for k, v in files.items() if v is None]
    if missing:
        raise FileNotFoundError(f"smallNORB {part} files missing in {folder}: {', '.join(missing)}")
    dat = read_norb_matrix(files["dat"])
    cat = read_norb_matrix(files["cat"])
    info = read_norb_matrix(files["info"])
    if dat.dtype != np.uint8 or dat.ndim != 4 or dat.shape[1:] != (2, 96, 96):
        raise NorbFormatError(f"{files['dat']}: expected a uint8 [N, 2, 96, 96] matrix, got {dat.dtype} {dat.shape}")
    if cat.ndim != 1 or cat.dtype.kind != "i":
        raise NorbFormatError(f"{files['cat']}: expected an int32 [N] matrix, got {cat.dtype} {cat.shape}")
    if info.ndim != 2 or info.shape[1] != 4 or info.dtype.kind != "i":
        raise NorbFormatError(f"{files['info']}: expected an int32 [N, 4] matrix, got {info.dtype} {info.shape}")
    n = dat.shape[0]
    if cat.shape[0] != n or info.shape[0] != n:
        raise NorbFormatError(f"smallNORB {part} in {folder}: {n} image pairs but {cat.shape[0]} categories and "
                              f"{info.shape[0]} info rows")
    if expected is not None and n != expected:
        raise NorbFormatError(f"smallNORB {part} in {folder}: {n} image pairs, the official files have {expected}")
    checks = [("category", cat, 0, 4), ("instance", info[:, 0], 0, 9), ("elevation", info[:, 1], 0, 8),
              ("azimuth", info[:, 2], 0, 34), ("lighting", info[:, 3], 0, 5)]
    for label, v, lo, hi in checks:
        if v.size and (v.min() < lo or v.max() > hi):
            raise NorbFormatError(f"smallNORB {part}: {label} values outside {lo}..{hi} ({v.min()}..{v.max()})")
    if info.size and np.any(info[:, 2] % 2):
        raise NorbFormatError(f"smallNORB {part}: odd azimuth values (expected 0, 2, ..., 34)")
    return {"images": np.ascontiguousarray(dat), "category": cat.astype(np.int64),
            "instance": info[:, 0].astype(np.int64), "elevation": info[:, 1].astype(np.int64),
            "azimuth": (info[:, 2] // 2).astype(np.int64), "lighting": info[:, 3].astype(np.int64)}


@register_dataset("smallnorb")
def _load_smallnorb(root: Path, split: str, download: bool, val_size: int = 2430, expected: int | None = _N,
                    **_: Any) -> ImageDataset:
    """``get_dataset("smallnorb", root, split)``: ``<root>/smallnorb/*.mat(.gz)`` (fetch with
    ``python data_scripts/smallnorb.py --root ROOT``). Images uint8 ``[N, 2, 96, 96]`` (left, right camera),
    labels = category; ``extra`` has ``instance``, ``elevation``, ``azimuth`` (index 0-17), ``lighting``.
    ``train_full``/``test`` are the official 24,300/24,300 instance split; ``val`` is a fixed random
    ``val_size`` of the training pairs and ``train`` the rest."""
    _check_split(split)
    folder = root / "smallnorb"
    part = "test" if split == "test" else "train"
    if any(v is None for v in norb_files(folder, part).values()):
        reason = "offline, or download=False" if not download else \
            "the loader does not download; run the script"
        raise unavailable("smallnorb", folder, "smallnorb.py", reason)
    a = load_smallnorb_arrays(folder, part, expected)
    x = torch.from_numpy(a["images"])
    labels = torch.from_numpy(a["category"])
    extra = {k: torch.from_numpy(a[k]) for k in ("instance", "elevation", "azimuth", "lighting")}
    ds = ImageDataset("smallnorb", split, x, labels, list(SMALLNORB_CLASSES),
                      description=f"smallNORB stereo pairs from <data root>/{folder.name}", extra=extra)
    if split in ("train", "val"):
        tr, va = train_val_indices(len(ds), min(val_size, len(ds) // 2))
        ds = ds.subset(tr if split == "train" else va)
        ds.split = split
    return ds


# ----------------------------------------------------------------------------------------- preprocessing
def shift_edge(x: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Shift each image by integer ``(dx[b], dy[b])`` with **edge** (replicate) fill: ``[B, C, H, W] -> same``.
    Equals torchvision ``RandomCrop(H, padding=m, padding_mode="edge")`` with crop offset ``m - d``."""
    B, C, H, W = x.shape
    rows = (torch.arange(H, device=x.device).view(1, H) - dy.view(B, 1).to(x.device)).clamp(0, H - 1)  # [B, H]
    cols = (torch.arange(W, device=x.device).view(1, W) - dx.view(B, 1).to(x.device)).clamp(0, W - 1)  # [B, W]
    b = torch.arange(B, device=x.device).view(B, 1, 1)
    return x.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def heinsen_transform(train: bool, max_shift: int = 16, coords: bool = True) -> Callable[[tuple, torch.Generator | None], tuple]:
    """Heinsen (2019) smallNORB input pipeline for :class:`~capsule_lib.data.TensorLoader`:
    training batches get a random shift of up to ``max_shift`` px (edge fill, i.e.
    ``RandomCrop(96, padding=16, padding_mode='edge')``) on the [0, 1] 96x96 pair; then (train and test) two
    coordinate channels are appended: ``[B, 2, 96, 96] -> [B, 4, 96, 96]``. No resizing."""

    def tf(batch: tuple, g: torch.Generator | None = None) -> tuple:
        x, *rest = batch
        if train and max_shift:
            d = torch.randint(-max_shift, max_shift + 1, (2, x.shape[0]), generator=g)
            x = shift_edge(x, d[0], d[1])
        if coords:
            x = add_coordinate_channels(x)
        return (x, *rest)

    return tf


def channel_stats(images: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std ``[C]`` of a uint8 or float ``[N, C, H, W]`` set (in [0, 1] units for
    uint8), accumulated in float64 chunks (the whole set is never converted at once)."""
    C = images.shape[1]
    s = torch.zeros(C, dtype=torch.float64)
    s2 = torch.zeros(C, dtype=torch.float64)
    n = 0
    for lo in range(0, images.shape[0], chunk):
        x = images[lo:lo + chunk].double()
        if images.dtype == torch.uint8:
            x = x / 255.0
        s += x.sum(dim=(0, 2, 3))
        s2 += (x * x).sum(dim=(0, 2, 3))
        n += x.shape[0] * x.shape[2] * x.shape[3]
    mean = s / n
    std = (s2 / n - mean * mean).clamp_min(0).sqrt()
    return mean.float(), std.float()


class EfficientNorbTransform:
    """Efficient-CapsNet (Mazzia et al. 2021) smallNORB pipeline on ``[B, 2, 96, 96]`` [0, 1] batches.

    1. Standardise each channel with ``mean``/``std`` computed **over the split itself** (the official code
       computes them separately for train and for test: pass :func:`channel_stats` of each split).
    2. Resize 96 -> ``resize`` (64, bilinear).
    3. Training: random ``crop`` (48) crop, random brightness ``+ U(-2, 2)`` (``tf.image.random_brightness``
       with ``max_delta=2.0``), random contrast ``(x - mean) * U(0.5, 1.5) + mean`` with the per-image,
       per-channel mean (``tf.image.random_contrast``). Test: centre crop (offset 8).

    Standardising before the (linear) resize equals the official order.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor, train: bool, resize: int = 64, crop: int = 48,
                 max_delta: float = 2.0, contrast: tuple[float, float] = (0.5, 1.5)) -> None:
        self.mean, self.std, self.train = torch.as_tensor(mean).float(), torch.as_tensor(std).float(), train
        self.resize, self.crop, self.max_delta, self.contrast = resize, crop, max_delta, contrast

    def __call__(self, batch: tuple, g: torch.Generator | None = None) -> tuple:
        x, *rest = batch
        x = x.float()
        x = (x - self.mean.to(x.device).view(1, -1, 1, 1)) / self.std.to(x.device).view(1, -1, 1, 1)
        x = F.interpolate(x, size=(self.resize, self.resize), mode="bilinear", align_corners=False, antialias=False)
        B = x.shape[0]
        m = self.resize - self.crop
        if self.train:
            off = torch.randint(0, m + 1, (2, B), generator=g)
            rows = off[0].view(B, 1) + torch.arange(self.crop).view(1, -1)
            cols = off[1].view(B, 1) + torch.arange(self.crop).view(1, -1)
            b = torch.arange(B).view(B, 1, 1)
            x = x.permute(0, 2, 3, 1)[b, rows[:, :, None].to(x.device), cols[:, None, :].to(x.device)].permute(0, 3, 1, 2)
            u = torch.rand(2, B, generator=g).to(x.device)
            x = x + ((u[0] * 2 - 1) * self.max_delta).view(B, 1, 1, 1)
            f = (self.contrast[0] + (self.contrast[1] - self.contrast[0]) * u[1]).view(B, 1, 1, 1)
            mu = x.mean(dim=(2, 3), keepdim=True)
            x = (x - mu) * f + mu
        else:
            o = m // 2
            x = x[:, :, o:o + self.crop, o:o + self.crop]
        return (x.contiguous(), *rest)


def hinton_transform(train: bool, resize: int | None = 48, crop: int = 32, brightness: float = 32 / 255,
                     contrast: float = 0.5) -> Callable[[tuple, torch.Generator | None], tuple]:
    """smallNORB preprocessing of the public EM-routing code (yl-1993/Matrix-Capsules-EM-PyTorch, following
    Hinton, Sabour & Frosst 2018): resize to 48 (bilinear), then training: random 32x32 crop and
    ``ColorJitter(brightness=32/255, contrast=0.5)`` (factors ``U(1 - b, 1 + b)`` and ``U(0.5, 1.5)``, applied
    in a random order per image, contrast around the image mean, clamped to [0, 1]); test: centre 32x32 crop.
    Works on any number of channels (that code feeds the two stereo images as separate samples: see
    :func:`stereo_as_samples`). ``resize=None`` takes images already at their working size (e.g. stored
    48x48 by :func:`~capsule_lib.data.viewpoints.viewpoint_sets`) and only crops and jitters them."""

    def tf(batch: tuple, g: torch.Generator | None = None) -> tuple:
        x, *rest = batch
        x = x.float()
        if resize is not None:
            x = F.interpolate(x, size=(resize, resize), mode="bilinear", align_corners=False, antialias=True)
        B, size = x.shape[0], x.shape[-1]
        m = size - crop
        if train:
            off = torch.randint(0, m + 1, (2, B), generator=g)
            rows = off[0].view(B, 1) + torch.arange(crop).view(1, -1)
            cols = off[1].view(B, 1) + torch.arange(crop).view(1, -1)
            b = torch.arange(B).view(B, 1, 1)
            x = x.permute(0, 2, 3, 1)[b, rows[:, :, None].to(x.device), cols[:, None, :].to(x.device)].permute(0, 3, 1, 2)
            u = torch.rand(3, B, generator=g).to(x.device)
            fb = (1 - brightness + 2 * brightness * u[0]).view(B, 1, 1, 1)
            fc = (1 - contrast + 2 * contrast * u[1]).view(B, 1, 1, 1)

            def bright(z):
                return (z * fb).clamp(0, 1)

            def contr(z):
                mu = z.mean(dim=(1, 2, 3), keepdim=True)
                return ((z - mu) * fc + mu).clamp(0, 1)

            first = (u[2] < 0.5).view(B, 1, 1, 1)
            x = torch.where(first, contr(bright(x)), bright(contr(x)))
        else:
            o = m // 2
            x = x[:, :, o:o + crop, o:o + crop]
        return (x.contiguous(), *rest)

    return tf


def stereo_as_samples(ds: ImageDataset) -> ImageDataset:
    """``[N, 2, H, W]`` stereo pairs -> ``[2N, 1, H, W]`` single images (left, right interleaved), labels and
    label fields repeated (how the public EM-routing code uses smallNORB)."""
    N = len(ds)
    x = ds.images.reshape(N * 2, 1, *ds.images.shape[2:])
    rep = {k: (v.repeat_interleave(2, dim=0) if isinstance(v, torch.Tensor) and v.shape[:1] == (N,) else v)
           for k, v in ds.extra.items()}
    rep["camera"] = torch.arange(2).repeat(N)
    return ImageDataset(ds.name, ds.split, x, ds.labels.repeat_interleave(2, dim=0), ds.classes, ds.generated,
                        ds.description + " (stereo images as separate samples)", rep)
