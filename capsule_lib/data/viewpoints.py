"""The novel-viewpoint protocol (Hinton, Sabour & Frosst 2018) on smallNORB or its rendered stand-in.

Train on the **training instances** seen only from *familiar* viewpoints; test on the **test instances**
(objects never seen in training) at the familiar viewpoints and at the *novel* ones. The difference of the
two test accuracies is the viewpoint-generalisation drop that the EM and Heinsen chapters compare across
models. Two axes, as in the paper:

* ``axis="azimuth"``: familiar azimuths 300, 320, 340, 0, 20, 40 degrees (6 of 18), all elevations;
* ``axis="elevation"``: familiar elevations 30, 35, 40 degrees (the 3 lowest of 9), all azimuths.

:func:`viewpoint_sets` builds the four sets at a chosen input size from ``smallnorb`` (real, under the data
root) or, when it is missing and stand-ins are allowed, from ``rendered_norb`` (GENERATED, same label
fields and instance split); the same code path serves both. Images are stereo pairs ``[N, 2, S, S]``,
downscaled from 96x96 by area averaging. The validation set is a fixed part of the familiar training views
(model selection never sees a test instance); the evaluation sets can be centre-cropped (Hinton et al.'s
32x32 test crop of 48x48 images), the training set is kept whole for random crops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .._checks import check_choice
from .datasets import DataSource, ImageDataset, get_dataset
from .render import HINTON_AZIMUTHS_FAMILIAR, HINTON_ELEVATIONS_FAMILIAR
from .._contracts import checked

__all__ = [
    "ViewpointSets",
    "viewpoint_sets",
    "viewpoint_sweep",
    "downscale_images",
    "center_crop_images",
    "familiar_values",
]

_AXES = {"azimuth": (18, HINTON_AZIMUTHS_FAMILIAR, "azimuths"), "elevation": (9, HINTON_ELEVATIONS_FAMILIAR, "elevations")}


@dataclass
class ViewpointSets:
    """The four sets of one viewpoint protocol: ``train`` and ``val`` (familiar views of the training
    instances), ``familiar`` and ``novel`` (test instances). ``axis`` and ``familiar_values`` (indices on that
    axis) say which protocol; ``generated`` is True for the rendered stand-in."""

    train: ImageDataset
    val: ImageDataset
    familiar: ImageDataset
    novel: ImageDataset
    axis: str
    familiar_values: tuple[int, ...]

    @property
    def generated(self) -> bool:
        return self.train.generated

    @property
    def name(self) -> str:
        return self.train.name

    def describe(self) -> str:
        """One line: data, protocol and sizes."""
        kind = "GENERATED rendered smallNORB-like" if self.generated else "smallNORB"
        return (
            f"{kind}, {self.axis} protocol (familiar {self.axis} indices {list(self.familiar_values)}): "
            f"train {len(self.train):,} / val {len(self.val):,} (training instances, familiar views), "
            f"test familiar {len(self.familiar):,} / novel {len(self.novel):,} (test instances), "
            f"images {tuple(self.train.images.shape[1:])} -> eval {tuple(self.familiar.images.shape[1:])}"
        )


def familiar_values(axis: str, familiar: Sequence[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(familiar, novel)`` indices on ``axis`` (``"azimuth"`` 0-17 or ``"elevation"`` 0-8)."""
    check_choice(axis, sorted(_AXES), "axis")
    n, default, _ = _AXES[axis]
    fam = tuple(sorted(familiar if familiar is not None else default))
    if not fam or not all(0 <= v < n for v in fam):
        raise ValueError(f"familiar {axis} indices must be a non-empty subset of 0..{n - 1}, got {list(fam)}")
    return fam, tuple(v for v in range(n) if v not in fam)


def downscale_images(images: torch.Tensor, size: int, chunk: int = 2048) -> torch.Tensor:
    """uint8 ``[N, C, H, W] -> [N, C, size, size]`` by area averaging (in chunks; no-op at the same size)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    out = torch.empty(*images.shape[:2], size, size, dtype=images.dtype)
    for lo in range(0, images.shape[0], chunk):
        y = F.interpolate(images[lo : lo + chunk].float(), size=(size, size), mode="area")
        out[lo : lo + chunk] = y.round().clamp(0, 255).to(images.dtype) if images.dtype == torch.uint8 else y
    return out


def center_crop_images(images: torch.Tensor, crop: int) -> torch.Tensor:
    """The central ``crop x crop`` window of ``[N, C, H, W]`` images (offset ``(H - crop) // 2``)."""
    H, W = images.shape[-2:]
    if crop > min(H, W):
        raise ValueError(f"crop {crop} is larger than the images ({H}x{W})")
    oy, ox = (H - crop) // 2, (W - crop) // 2
    return images[..., oy : oy + crop, ox : ox + crop].contiguous()


def _resized(ds: ImageDataset, size: int, crop: int | None) -> ImageDataset:
    x = downscale_images(ds.images, size)
    if crop is not None:
        x = center_crop_images(x, crop)
    return ImageDataset(ds.name, ds.split, x, ds.labels, ds.classes, ds.generated, ds.description, ds.extra, ds.standin_for)


def _pick(ds: ImageDataset, axis: str, values: Sequence[int], n: int | None, seed: int) -> ImageDataset:
    """The samples of ``ds`` whose ``axis`` index is in ``values`` (a seeded random ``n`` of them if given)."""
    if axis not in ds.extra:
        raise ValueError(f"dataset {ds.name} has no {axis!r} label field")
    keep = torch.isin(ds.extra[axis], torch.as_tensor(list(values))).nonzero().flatten()
    if n is not None and n < keep.numel():
        g = torch.Generator().manual_seed(seed + 99991)
        keep = keep[torch.randperm(keep.numel(), generator=g)[:n].sort().values]
    return ds.subset(keep)


@checked
def viewpoint_sets(
    dataset: str = "smallnorb",
    data_root: DataSource | str | None = None,
    *,
    axis: str = "azimuth",
    familiar: Sequence[int] | None = None,
    size: int = 48,
    eval_crop: int | None = None,
    n_train: int | None = None,
    n_test: int | None = None,
    standin: bool | None = None,
    seed: int = 0,
    workers: int = 1,
) -> ViewpointSets:
    """Train / val / familiar-test / novel-test sets of the novel-viewpoint protocol.

    Parameters
    ----------
    dataset
        ``"smallnorb"`` (real; falls back to ``"rendered_norb"`` when missing and ``standin`` allows it, see
        :func:`~capsule_lib.data.get_dataset`) or ``"rendered_norb"``.
    data_root
        the data root, or a :class:`~capsule_lib.data.DataSource` (a chapter's ``cfg.data``: data root, offline mode,
        stand-ins allowed); ``standin``, when given, overrides the source's.
    axis, familiar
        the protocol: ``"azimuth"`` or ``"elevation"``, and the familiar indices on that axis (default: the
        paper's, see the module docstring).
    size
        side of the stored images after area downscaling from 96 (48 in Hinton et al.).
    eval_crop
        centre-crop the validation and test images to this side (32 in Hinton et al.); ``None`` keeps ``size``.
    n_train, n_test
        keep a seeded random subset of this many training images / images per test set (smoke runs, quick
        evaluations); the validation set is cut to ``n_test`` too.
    seed
        the rendered set's seed and the subsets' seed.
    workers
        processes rendering the generated set.
    """
    fam, novel = familiar_values(axis, familiar)
    key = _AXES[axis][2]
    kw = {"seed": seed, "workers": workers}
    # The rendered loader renders only what the filters keep; the real loader ignores them (filtered below).
    tr = get_dataset(dataset, data_root, "train", standin=standin, **{key: fam}, n=n_train, **kw)
    va = get_dataset(dataset, data_root, "val", standin=standin, **{key: fam}, n=n_test, **kw)
    tr, va = _pick(tr, axis, fam, n_train, seed), _pick(va, axis, fam, n_test, seed)
    if tr.name == "rendered_norb":  # render the two test groups separately (each with its own n)
        te_f = get_dataset(tr.name, data_root, "test", **{key: fam}, n=n_test, **kw)
        te_n = get_dataset(tr.name, data_root, "test", **{key: novel}, n=n_test, **kw)
    else:
        te_f = te_n = get_dataset(dataset, data_root, "test", standin=standin, **kw)
    te_f, te_n = _pick(te_f, axis, fam, n_test, seed), _pick(te_n, axis, novel, n_test, seed + 1)
    for ds, what in ((te_f, f"familiar {axis}s"), (te_n, f"novel {axis}s")):
        ds.description = f"{ds.description} [test instances, {what}]"
    return ViewpointSets(
        _resized(tr, size, None),
        _resized(va, size, eval_crop),
        _resized(te_f, size, eval_crop),
        _resized(te_n, size, eval_crop),
        axis,
        fam,
    )


def viewpoint_sweep(
    dataset: str = "smallnorb",
    data_root: DataSource | str | None = None,
    *,
    category: int,
    instance: int,
    elevations: Sequence[int] = (4,),
    azimuths: Sequence[int] = tuple(range(18)),
    lightings: Sequence[int] = (0,),
    size: int = 48,
    standin: bool | None = None,
    seed: int = 0,
) -> ImageDataset:
    """One test object (``category``, ``instance``: a test instance, 0, 1, 2, 3 or 5) seen from every listed
    elevation x azimuth x lighting index, area-downscaled to ``size``, ordered by (elevation, azimuth,
    lighting); labels in ``extra`` as usual. From ``smallnorb`` (its test split, filtered) or the rendered
    stand-in (only those views are rendered)."""
    filters = {"categories": [category], "instances": [instance], "elevations": list(elevations),
               "azimuths": list(azimuths), "lightings": list(lightings)}
    ds = get_dataset(dataset, data_root, "test", standin=standin, seed=seed, **filters)
    keep = ds.labels == category
    for key, values in (("instance", [instance]), ("elevation", elevations), ("azimuth", azimuths),
                        ("lighting", lightings)):
        keep &= torch.isin(ds.extra[key], torch.as_tensor(list(values)))
    idx = keep.nonzero().flatten()
    order = (ds.extra["elevation"][idx] * 18 + ds.extra["azimuth"][idx]) * 6 + ds.extra["lighting"][idx]
    idx = idx[order.argsort()]
    if idx.numel() == 0:
        raise ValueError(f"{ds.name}: no test images of category {category}, instance {instance} at these views")
    return _resized(ds.subset(idx), size, None)
