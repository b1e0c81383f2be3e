"""affNIST (Tieleman 2013): the official transformed **test** set, for robustness tests of MNIST-trained models.

http://www.cs.toronto.edu/~tijmen/affNIST/ : 32 random affine transformations of each of the 10,000 MNIST
test digits (320,000 images, 40x40 uint8). The file ``32x/transformed/test.mat.zip`` holds ``test.mat``, a
MATLAB file with one struct ``affNISTdata`` whose fields are (one column per image)::

    image                     uint8  [1600, N]   each column a 40x40 image (read as row-major, as the
                                                 TensorFlow Datasets builder and most loaders do)
    label_int                 uint8  [1, N]      digit 0-9
    label_one_of_n            [10, N]            one-hot (not needed)
    human_readable_transform  [k, N]             the transformation parameters (kept as ``extra["transform"]``)

Sabour et al. (2017) train on MNIST placed at random positions on a 40x40 canvas (:func:`random_place`)
and test on this set: CapsNet 79 %, CNN 66 %. :func:`center_pad` gives affNIST's "just centred" MNIST.
"""
from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .datasets import ImageDataset, register_dataset, unavailable
from .transforms import shift_images

__all__ = ["read_affnist_mat", "affnist_file", "AffNISTFormatError", "center_pad", "random_place"]

_CANDIDATES = ("affNIST_test.mat", "test.mat", "test.mat.zip")


class AffNISTFormatError(ValueError):
    """The file is not an affNIST ``.mat`` file of the expected structure."""


def read_affnist_mat(source: str | Path | bytes) -> dict[str, np.ndarray]:
    """Read an affNIST ``.mat`` (a path, a ``.zip`` holding ``test.mat``, or the bytes of a ``.mat``) into
    ``images`` uint8 ``[N, 40, 40]``, ``labels`` int64 ``[N]`` and, when present, ``transform``
    float ``[N, k]`` (``human_readable_transform``)."""
    import scipy.io

    name = "<bytes>"
    if isinstance(source, (str, Path)):
        p = Path(source)
        name = str(p)
        if p.suffix == ".zip":
            with zipfile.ZipFile(p) as z:
                members = [m for m in z.namelist() if m.endswith(".mat")]
                if not members:
                    raise AffNISTFormatError(f"{p}: no .mat file inside the zip")
                source = z.read(members[0])
        else:
            source = p.read_bytes()
    try:
        mat = scipy.io.loadmat(io.BytesIO(source))
    except Exception as e:  # scipy raises several types for corrupt files
        raise AffNISTFormatError(f"{name}: not a readable MATLAB file ({type(e).__name__}: {e})") from e
    if "affNISTdata" not in mat:
        raise AffNISTFormatError(f"{name}: no 'affNISTdata' struct (variables: {sorted(k for k in mat if not k.startswith('__'))})")
    s = mat["affNISTdata"]
    try:
        rec = s[0, 0]
        img = np.asarray(rec["image"])
        lab = np.asarray(rec["label_int"]).reshape(-1)
    except (IndexError, ValueError, KeyError) as e:
        raise AffNISTFormatError(f"{name}: 'affNISTdata' lacks the 'image'/'label_int' fields") from e
    if img.ndim != 2 or img.shape[0] != 1600:
        raise AffNISTFormatError(f"{name}: 'image' should be [1600, N] (40x40 columns), got {img.shape}")
    if lab.shape[0] != img.shape[1]:
        raise AffNISTFormatError(f"{name}: {img.shape[1]} images but {lab.shape[0]} labels")
    if lab.size and (lab.min() < 0 or lab.max() > 9):
        raise AffNISTFormatError(f"{name}: labels outside 0..9")
    out = {"images": np.ascontiguousarray(img.T.reshape(-1, 40, 40).astype(np.uint8)), "labels": lab.astype(np.int64)}
    if "human_readable_transform" in (rec.dtype.names or ()):
        t = np.asarray(rec["human_readable_transform"], dtype=np.float64)
        if t.ndim == 2 and t.shape[1] == img.shape[1]:
            out["transform"] = np.ascontiguousarray(t.T)
    return out


def affnist_file(folder: Path) -> Path | None:
    """The affNIST test file in ``folder``: ``affNIST_test.mat``, ``test.mat`` or ``test.mat.zip``."""
    for name in _CANDIDATES:
        if (folder / name).exists():
            return folder / name
    return None


@register_dataset("affnist")
def _load_affnist(root: Path, split: str, download: bool, **_: Any) -> ImageDataset:
    """``get_dataset("affnist", root, "test")``: the official affNIST test set from ``<root>/affnist/``
    (fetch with ``python data_scripts/affnist.py --root ROOT``). Images uint8 ``[320000, 1, 40, 40]``."""
    if split != "test":
        raise ValueError("affnist provides only the official test set (split='test'); train on MNIST "
                         "(e.g. with transforms.random_place to 40x40) and test here")
    folder = root / "affnist"
    f = affnist_file(folder)
    if f is None:
        reason = "offline, or download=False" if not download else \
            "the loader does not download; run the script"
        raise unavailable("affnist", folder, "affnist.py", reason)
    a = read_affnist_mat(f)
    extra = {"transform": torch.from_numpy(a["transform"])} if "transform" in a else {}
    return ImageDataset("affnist", "test", torch.from_numpy(a["images"]).unsqueeze(1), torch.from_numpy(a["labels"]),
                        [str(i) for i in range(10)], description=f"affNIST test set from <data root>/.../{f.name}", extra=extra)


def center_pad(x: torch.Tensor, size: int = 40) -> torch.Tensor:
    """Zero-pad ``[B, C, h, w]`` images to ``[B, C, size, size]`` with the image in the centre (affNIST's
    "just centred" MNIST: 28x28 padded by 6 to 40x40)."""
    h, w = x.shape[-2:]
    if h > size or w > size:
        raise ValueError(f"images of {h}x{w} do not fit in {size}x{size}")
    top, left = (size - h) // 2, (size - w) // 2
    return F.pad(x, (left, size - w - left, top, size - h - top))


def random_place(x: torch.Tensor, size: int = 40, generator: torch.Generator | None = None) -> torch.Tensor:
    """Put each ``h x w`` image at a uniformly random integer position on a zero ``size x size`` canvas, the
    whole image inside (Sabour et al. 2017 train on MNIST placed at random on 40x40 before testing on
    affNIST): ``[B, C, h, w] -> [B, C, size, size]``."""
    B, C, h, w = x.shape
    if h > size or w > size:
        raise ValueError(f"images of {h}x{w} do not fit in {size}x{size}")
    oy = torch.randint(0, size - h + 1, (B,), generator=generator)
    ox = torch.randint(0, size - w + 1, (B,), generator=generator)
    top, left = (size - h) // 2, (size - w) // 2
    return shift_images(center_pad(x, size), (ox - left).to(x.device), (oy - top).to(x.device))
