"""MultiMNIST: two overlapping digits of different classes per 36x36 image (GENERATED, deterministic in a seed).

**Sabour et al. (2017)** recipe, as in the official ``mnist_shift.py`` (``--shift=4 --pad=4``): pad each
28x28 digit by 4 to 36x36, shift each digit independently by an integer in [-4, 4] on both axes (zero fill),
pair a base digit with a random digit **of a different class** from the same split, and merge with
``min(a + b, 255)``. The official set has 1,000 pairs per digit (60M training images); here ``n`` pairs are
made by cycling through the source digits as bases (default: one pair per source digit).

**Efficient-CapsNet** variant (Mazzia et al. 2021, ``pre_process_multimnist.py``): the same padding to 36,
shifts in [-6, 6] (pad 6 then crop back, so a digit can lose a few border columns), merge
``clip(a + b, 0, 1)`` (the same as the uint8 ``min(a + b, 255)``). Its training stream only requires the
partner to be a different *image* (``allow_same_class=True`` reproduces that); its validation/test pairs
have different labels (the default here).

Both return the merged image, both labels and both shifted source images (the reconstruction targets).
:func:`overlap_stats` reports the bounding-box overlap of the two digits (Sabour et al.: digits in a
28x28 image lie in a 20x20 box, and with +-4 px shifts two boxes overlap by 80 % on average).

The source digits are real MNIST from the data root when present; in offline mode (``offline=True``)
or with ``source="glyph_digits"`` they are the generated glyph digits, and the description says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from .._checks import check_choice
from .datasets import (
    _REGISTRY,
    DatasetUnavailableError,
    ImageDataset,
    _check_split,
    data_fingerprint,
    register_dataset,
    unavailable,
)
from .loaders import TensorLoader
from .transforms import shift_images
from .._contracts import checked

__all__ = [
    "make_multimnist",
    "bounding_boxes",
    "bbox_overlap",
    "overlap_stats",
    "mnist_source",
    "MultiMNISTLoader",
    "VARIANTS",
]

#: variant -> (pad, max_shift)
VARIANTS = {"sabour": (4, 4), "efficient": (4, 6)}
_SPLIT_SEED = {"train": 0, "val": 1, "train_full": 2, "test": 3}


def mnist_source(
    root: Path,
    split: str,
    download: bool,
    source: str = "auto",
    dataset: str = "multimnist",
    n_glyph: int | None = None,
) -> tuple[ImageDataset, str]:
    """The digits a generated MNIST variant is built from: ``(dataset, "mnist" | "glyph_digits")``.

    ``source="auto"`` or ``"mnist"``: real MNIST (under ``root`` or downloaded) or a
    :class:`DatasetUnavailableError`; whether to fall back to the generated digits instead is decided by
    :func:`~capsule_lib.data.get_dataset` (its ``standin`` argument), which then passes
    ``source="glyph_digits"``: always generated (``n_glyph`` of them, default the glyph split's size).
    """
    if source not in ("auto", "mnist", "glyph_digits"):
        raise ValueError(f"source must be 'auto', 'mnist' or 'glyph_digits', got {source!r}")
    if source == "glyph_digits":
        return _REGISTRY["glyph_digits"](root, split, download, n=n_glyph), "glyph_digits"
    try:
        return _REGISTRY["mnist"](root, split, download), "mnist"
    except DatasetUnavailableError as e:
        raise unavailable(
            f"{dataset} (built from mnist)",
            root / "mnist",
            "mnist.py",
            "its source MNIST is missing; offline or with standin=True it is built from "
            "the generated glyph_digits instead",
        ) from e


def make_multimnist(
    images: torch.Tensor,
    labels: torch.Tensor,
    n: int | None = None,
    variant: str = "sabour",
    seed: int = 0,
    allow_same_class: bool = False,
    max_shift: int | None = None,
    pad: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pairs of shifted, overlaid digits from ``images`` uint8 ``[N, 1, 28, 28]`` and ``labels [N]``.

    Base digit ``k`` is source ``k % N`` (so bases are used equally often); its partner is uniform over the
    source digits of another class (or, with ``allow_same_class``, over all other source digits). Returns
    ``merged`` uint8 ``[n, 1, S, S]`` (S = 28 + 2 pad), ``source_a``/``source_b`` (the shifted digits),
    ``label_a``/``label_b``, ``index_a``/``index_b`` (source positions) and ``shift_a``/``shift_b``
    ``[n, 2]`` as (dx, dy).
    """
    check_choice(variant, sorted(VARIANTS), "variant")
    p0, s0 = VARIANTS[variant]
    pad = p0 if pad is None else pad
    max_shift = s0 if max_shift is None else max_shift
    N = images.shape[0]
    if images.dtype != torch.uint8 or images.dim() != 4:
        raise ValueError(f"images: expected uint8 [N, C, H, W], got {images.dtype} {tuple(images.shape)}")
    labels = labels.long()
    n = N if n is None else int(n)
    g = torch.Generator().manual_seed(int(seed))
    a = torch.arange(n) % N
    order = torch.argsort(labels, stable=True)  # source positions sorted by class
    counts = torch.bincount(labels, minlength=int(labels.max()) + 1)
    starts = torch.cumsum(counts, 0) - counts
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if allow_same_class:
        j = (u * (N - 1)).long().clamp_max(N - 2)
        b = j + (j >= a).long()  # uniform over all other source images
    else:
        ca = labels[a]
        others = N - counts[ca]
        if (others <= 0).any():
            raise ValueError("MultiMNIST needs digits of at least two classes")
        j = (u * others).long().clamp_max(others - 1)  # rank among the digits of other classes
        pos = torch.where(j < starts[ca], j, j + counts[ca])  # skip the base's class block in `order`
        b = order[pos]
    sh = torch.randint(-max_shift, max_shift + 1, (2, n, 2), generator=g)  # [a/b, n, (dx, dy)]
    canvas_a = F.pad(images[a], (pad, pad, pad, pad))
    canvas_b = F.pad(images[b], (pad, pad, pad, pad))
    src_a = shift_images(canvas_a, sh[0, :, 0], sh[0, :, 1])
    src_b = shift_images(canvas_b, sh[1, :, 0], sh[1, :, 1])
    merged = (src_a.int() + src_b.int()).clamp_max(255).to(torch.uint8)
    return {
        "merged": merged,
        "source_a": src_a,
        "source_b": src_b,
        "label_a": labels[a],
        "label_b": labels[b],
        "index_a": a,
        "index_b": b,
        "shift_a": sh[0],
        "shift_b": sh[1],
    }


def bounding_boxes(images: torch.Tensor, threshold: int = 0) -> torch.Tensor:
    """Tight boxes of the pixels ``> threshold``: ``[N, C, H, W] -> [N, 4]`` as (top, bottom, left, right),
    inclusive; an empty image gives (0, -1, 0, -1)."""
    m = (images > threshold).any(dim=1)  # [N, H, W]
    rows, cols = m.any(dim=2), m.any(dim=1)  # [N, H], [N, W]
    H, W = rows.shape[1], cols.shape[1]
    top = rows.float().argmax(1)
    bottom = H - 1 - rows.flip(1).float().argmax(1)
    left = cols.float().argmax(1)
    right = W - 1 - cols.flip(1).float().argmax(1)
    empty = ~rows.any(1)
    box = torch.stack([top, bottom, left, right], 1)
    return torch.where(empty[:, None], torch.tensor([0, -1, 0, -1]), box)


def bbox_overlap(a: torch.Tensor, b: torch.Tensor, threshold: int = 0) -> dict[str, torch.Tensor]:
    """Per pair of images ``[N, C, H, W]``: ``iou`` (intersection / union of the two digits' boxes) and
    ``inter_over_min`` (intersection / area of the smaller box), both ``[N]`` in [0, 1]."""
    ba, bb = bounding_boxes(a, threshold), bounding_boxes(b, threshold)

    def area(x):
        return ((x[:, 1] - x[:, 0] + 1).clamp_min(0) * (x[:, 3] - x[:, 2] + 1).clamp_min(0)).float()

    ih = (torch.minimum(ba[:, 1], bb[:, 1]) - torch.maximum(ba[:, 0], bb[:, 0]) + 1).clamp_min(0)
    iw = (torch.minimum(ba[:, 3], bb[:, 3]) - torch.maximum(ba[:, 2], bb[:, 2]) + 1).clamp_min(0)
    inter = (ih * iw).float()
    aa, ab = area(ba), area(bb)
    union = aa + ab - inter
    return {"iou": inter / union.clamp_min(1), "inter_over_min": inter / torch.minimum(aa, ab).clamp_min(1)}


@checked
def overlap_stats(ds: ImageDataset | dict[str, torch.Tensor]) -> dict[str, float]:
    """Summary of the bounding-box overlap of a MultiMNIST set (an :class:`ImageDataset` from
    ``get_dataset("multimnist", ...)`` or the dict of :func:`make_multimnist`): mean / median / 5th and 95th
    percentiles of the IoU and of the intersection over the smaller box, the share of pairs whose boxes
    overlap at all, and the mean shift magnitudes."""
    d = ds.extra if isinstance(ds, ImageDataset) else ds
    missing = [k for k in ("source_a", "source_b", "shift_a", "shift_b") if k not in d]
    if missing:
        raise ValueError(
            f"overlap_stats: ds must be a MultiMNIST set (get_dataset('multimnist', ...) or make_multimnist's dict); it "
            f"has no {', '.join(missing)}"
        )
    ov = bbox_overlap(d["source_a"], d["source_b"])
    out: dict[str, float] = {"n": float(d["source_a"].shape[0])}
    for k, v in ov.items():
        out[f"{k}_mean"] = v.mean().item()
        out[f"{k}_median"] = v.median().item()
        out[f"{k}_p05"] = v.quantile(0.05).item()
        out[f"{k}_p95"] = v.quantile(0.95).item()
    out["any_overlap"] = (ov["iou"] > 0).float().mean().item()
    sh = torch.cat([d["shift_a"], d["shift_b"]]).float()
    out["max_abs_shift"] = sh.abs().max().item()
    out["mean_abs_shift"] = sh.abs().mean().item()
    return out


@register_dataset("multimnist")
def _load_multimnist(
    root: Path,
    split: str,
    download: bool,
    *,
    variant: str = "sabour",
    n: int | None = None,
    seed: int = 0,
    source: str = "auto",
    allow_same_class: bool = False,
    **_: Any,
) -> ImageDataset:
    """``get_dataset("multimnist", root, split, variant="sabour" | "efficient", n=None, seed=0,
    source="auto")``: GENERATED pairs from the MNIST ``split`` (``n`` defaults to one pair per source
    digit). Images uint8 ``[n, 1, 36, 36]``; labels multi-hot int64 ``[n, 10]``; ``extra``:
    ``label_a``/``label_b``, ``source_a``/``source_b`` (shifted 36x36 digits, reconstruction targets),
    ``shift_a``/``shift_b``, ``index_a``/``index_b``."""
    _check_split(split)
    src, kind = mnist_source(root, split, download, source, "multimnist", n_glyph=n)
    d = make_multimnist(
        src.images, src.labels, n, variant, seed=1000 * seed + _SPLIT_SEED[split], allow_same_class=allow_same_class
    )
    multi_hot = F.one_hot(d["label_a"], 10) | F.one_hot(d["label_b"], 10)
    pad, shift = VARIANTS[variant]
    what = "real MNIST" if kind == "mnist" else "the generated glyph_digits (NOT MNIST)"
    desc = (
        f"GENERATED MultiMNIST ({variant} recipe: pad {pad} to 36x36, shifts up to ±{shift} px, "
        f"{'any other digit' if allow_same_class else 'different classes'}, merged min(a+b, 255)) built from "
        f"{what} {split} digits, seed {seed}."
    )
    extra = {k: v for k, v in d.items() if k != "merged"}
    return ImageDataset(
        "multimnist",
        split,
        d["merged"],
        multi_hot.long(),
        [str(i) for i in range(10)],
        generated=True,
        description=desc,
        extra=extra,
    )


class MultiMNISTLoader:
    """Batches ``(merged, labels [B, 2], source_a, source_b)`` of MultiMNIST pairs built from ``source``
    digits (an :class:`~capsule_lib.data.ImageDataset`), with **fresh pairs every epoch** when ``fresh``
    (the official training stream is endless); evaluation loaders keep one fixed set (``fresh=False``)."""

    def __init__(
        self,
        source: Any,
        n: int,
        batch_size: int,
        variant: str,
        *,
        seed: int = 0,
        fresh: bool = True,
        shuffle: bool = True,
        device: torch.device | str = "cpu",
        **shard: Any,
    ) -> None:
        self.shard = shard  # rank / world_size / pad_shards for the TensorLoader (distributed jobs)
        self.source, self.n, self.batch_size, self.variant = source, n, batch_size, variant
        self.seed, self.fresh, self.shuffle, self.device = seed, fresh, shuffle, torch.device(device)
        self.epoch = 0
        self._cache: tuple[int, TensorLoader] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _loader(self) -> TensorLoader:

        key = self.epoch if self.fresh else 0
        if self._cache is None or self._cache[0] != key:
            d = make_multimnist(
                self.source.images, self.source.labels, self.n, self.variant, seed=self.seed * 1_000_003 + key
            )
            y2 = torch.stack([d["label_a"], d["label_b"]], 1)
            self._cache = (
                key,
                TensorLoader(
                    [d["merged"], y2, d["source_a"], d["source_b"]],
                    self.batch_size,
                    shuffle=self.shuffle,
                    seed=self.seed,
                    device=self.device,
                    **self.shard,
                ),
            )
        return self._cache[1]

    def fingerprint(self) -> str:
        """The content fingerprint of the source digits the pairs are made of (what a run records)."""
        return data_fingerprint(self.source.images, self.source.labels)

    def pairs(self) -> ImageDataset:
        """The current epoch's pairs as a dataset: ``images`` uint8 ``[n, 1, S, S]``, ``labels`` ``[n, 2]`` (what a
        shipped checkpoint's validation and test figures are computed on), ``source_a``/``source_b`` in ``extra``."""
        merged, y2, src_a, src_b = self._loader().tensors
        return ImageDataset(
            "multimnist",
            "pairs",
            merged,
            y2,
            [str(i) for i in range(10)],
            generated=True,
            description=f"GENERATED MultiMNIST pairs ({self.variant} recipe, {self.n} pairs, seed {self.seed})",
            extra={"source_a": src_a, "source_b": src_b},
        )

    def __len__(self) -> int:
        rank, world = self.shard.get("rank", 0), self.shard.get("world_size", 1)
        n = math.ceil(self.n / world) if self.shard.get("pad_shards", True) else len(range(rank, self.n, world))
        return math.ceil(n / self.batch_size)

    def __iter__(self):
        loader = self._loader()
        loader.set_epoch(self.epoch)
        return iter(loader)
