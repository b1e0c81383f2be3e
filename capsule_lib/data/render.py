"""A rendered smallNORB-like dataset: simple 3-D objects ray-cast offline (GENERATED data, not smallNORB).

smallNORB (LeCun, Huang & Bottou 2004) photographs 50 toys (5 categories x 10 instances) at 9 camera
elevations (30-70 degrees, step 5) x 18 azimuths (0-340 degrees, step 20) x 6 lighting conditions, as
96x96 grey stereo pairs; training instances 4, 6, 7, 8, 9 and test instances 0, 1, 2, 3, 5 of every
category. This module builds a synthetic set with exactly that structure, so the viewpoint experiments of
the book can run without the real files:

* 5 categories of composite objects made of analytic primitives (ellipsoids, boxes, capped elliptic
  cylinders): ``animal`` (four legs, body, neck, head, tail), ``human`` (torso, hips, head, arms, legs),
  ``airplane`` (fuselage, wings, tailplane, fin, engines), ``truck`` (cab, cargo box, six wheels) and
  ``car`` (body, cabin, four wheels). Each of the 10 instances per category has its own shape parameters
  (proportions, limb angles, wing sweep, ...), drawn from a fixed seed; every instance is scaled to the same
  bounding radius so size does not give the category away.
* Cameras on a sphere around the object at smallNORB's 9 elevations and 18 azimuths, two verging cameras a
  small baseline apart (the stereo pair), perspective projection, 96x96 pixels.
* Lambertian shading under 6 lighting conditions (ambient level plus one to three directional lights). As
  in smallNORB, where the turntable rotates the object and the lights stay with the cameras, the lights
  turn with the camera azimuth (not with the elevation). No cast shadows, no texture.
* Mild blur (one-pixel anti-aliasing) and Gaussian pixel noise, seeded.

Rendering is vectorised (torch, float32): the geometry (first hit, normal, albedo) is computed once per
(object, viewpoint, camera) for all pixels of all views in large chunks, and the 6 lighting conditions are
then a cheap dot product. Rays that miss an object's bounding sphere are skipped. The renderer is
:mod:`capsule_lib.data.raycast`; this module makes the dataset.

Labels follow the smallNORB loader (:mod:`capsule_lib.data.smallnorb`): ``category`` 0-4, ``instance``
0-9, ``elevation`` index 0-8 (30 + 5k degrees), ``azimuth`` index 0-17 (20k degrees), ``lighting`` 0-5.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import torch

from .datasets import ImageDataset, _check_split, register_dataset, train_val_indices
from .raycast import BOX, CATEGORIES, CYLINDER, ELLIPSOID, N_LIGHTINGS, Camera, Primitives, make_object, render_object, trace  # noqa: F401

__all__ = [
    "TRAIN_INSTANCES", "TEST_INSTANCES", "ELEVATIONS_DEG", "AZIMUTHS_DEG", "render_norb_like", "norb_grid",
    "viewpoint_split",
    "HINTON_AZIMUTHS_FAMILIAR", "HINTON_ELEVATIONS_FAMILIAR", "elevation_degrees", "azimuth_degrees",
]

TRAIN_INSTANCES = (4, 6, 7, 8, 9)   # as smallNORB
TEST_INSTANCES = (0, 1, 2, 3, 5)
ELEVATIONS_DEG = tuple(30 + 5 * k for k in range(9))
AZIMUTHS_DEG = tuple(20 * k for k in range(18))
#: Hinton, Sabour & Frosst (2018), novel-viewpoint experiments. Train on azimuths 300, 320, 340, 0, 20, 40
#: degrees (indices below) or on the 3 lowest elevations, test on the rest.
HINTON_AZIMUTHS_FAMILIAR = (15, 16, 17, 0, 1, 2)
#: The familiar elevation indices of the same experiments (the 3 lowest elevations, 30-40 degrees).
HINTON_ELEVATIONS_FAMILIAR = (0, 1, 2)


def elevation_degrees(index: torch.Tensor | int) -> torch.Tensor | int:
    """smallNORB elevation index 0-8 -> degrees (30, 35, ..., 70)."""
    return 30 + 5 * index


def azimuth_degrees(index: torch.Tensor | int) -> torch.Tensor | int:
    """smallNORB azimuth index 0-17 -> degrees (0, 20, ..., 340)."""
    return 20 * index


# ------------------------------------------------------------------------------------------ dataset
_FIELDS = ("category", "instance", "elevation", "azimuth", "lighting")


def _split_instances(split: str) -> tuple[int, ...]:
    return TEST_INSTANCES if split == "test" else TRAIN_INSTANCES


def _grid(categories: Sequence[int], instances: Sequence[int]) -> dict[str, torch.Tensor]:
    """All (category, instance, elevation, azimuth, lighting) combinations, in that nesting order."""
    g = torch.cartesian_prod(torch.as_tensor(list(categories)), torch.as_tensor(list(instances)),
                             torch.arange(9), torch.arange(18), torch.arange(N_LIGHTINGS))
    return {k: g[:, i].contiguous() for i, k in enumerate(_FIELDS)}


def norb_grid(split: str = "train") -> dict[str, torch.Tensor]:
    """The label fields of every sample of a full smallNORB-like split (24,300 = 5 categories x 5 instances
    x 9 elevations x 18 azimuths x 6 lightings), in the order :func:`render_norb_like` returns them."""
    return _grid(range(len(CATEGORIES)), _split_instances(split))


def _select(labels: dict[str, torch.Tensor], **allowed: Sequence[int] | None) -> torch.Tensor:
    keep = torch.ones_like(labels["category"], dtype=torch.bool)
    for k, vals in allowed.items():
        if vals is not None:
            keep &= torch.isin(labels[k], torch.as_tensor(list(vals)))
    return keep


def _render_views(task: tuple) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Worker: render the listed viewpoints of one object, all lightings, as uint8 with per-view noise."""
    category, instance, views, size, seed, noise, camera, threads = task
    prims = make_object(category, instance, seed)
    el, az = views[:, 0], views[:, 1]
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        img = render_object(prims, el, az, size, camera)  # [V, 6, 2, S, S] float
        if noise > 0:
            for v in range(views.shape[0]):  # noise depends only on (seed, object, viewpoint)
                g = torch.Generator().manual_seed(((seed * 7 + category) * 17 + instance) * 1000 + int(el[v]) * 18 + int(az[v]))
                img[v].add_(torch.randn(img[v].shape, generator=g), alpha=noise / 255.0)
        out = img.mul_(255).round_().clamp_(0, 255).to(torch.uint8)
    finally:
        torch.set_num_threads(before)
    return category, instance, el, az, out


def render_norb_like(split: str = "train", *, categories: Sequence[int] | None = None,
                     instances: Sequence[int] | None = None, elevations: Sequence[int] | None = None,
                     azimuths: Sequence[int] | None = None, lightings: Sequence[int] | None = None,
                     n: int | None = None, index: torch.Tensor | None = None, size: int = 96, seed: int = 0,
                     noise: float = 2.0, workers: int = 1, threads: int | None = 1,
                     camera: Camera | None = None) -> dict[str, torch.Tensor]:
    """Render (part of) a smallNORB-like split. ``split``: ``"train"`` (instances 4, 6, 7, 8, 9) or
    ``"test"`` (0, 1, 2, 3, 5). Optional filters keep only the listed categories / instances (which must
    belong to the split) / elevation indices (0-8) / azimuth indices (0-17) / lightings (0-5); ``index``
    keeps those positions of the (filtered) grid and ``n`` a seeded random ``n`` of what is left.

    Returns ``images`` uint8 ``[N, 2, size, size]`` (left, right camera) and int64 ``[N]`` label fields
    ``category``, ``instance``, ``elevation``, ``azimuth``, ``lighting``, ordered by
    (category, instance, elevation, azimuth, lighting). A sample's pixels depend only on ``seed`` and its
    own labels (not on which other samples are rendered). ``workers > 1`` renders objects in that many
    processes (started with ``spawn``: a script that uses them needs an ``if __name__ == "__main__":``
    guard). ``threads`` is the torch thread count while rendering (1 by default: the element-wise work
    gains little from more threads and suffers badly when the cores are shared; ``None`` leaves it).
    """
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _render_norb_like(split, categories, instances, elevations, azimuths, lightings, n, index, size, seed,
                                 noise, workers, threads, camera)
    finally:
        torch.set_num_threads(before)


def _render_norb_like(split, categories, instances, elevations, azimuths, lightings, n, index, size, seed, noise,
                      workers, threads, camera) -> dict[str, torch.Tensor]:
    split_inst = _split_instances(split)
    if instances is not None and not set(instances) <= set(split_inst):
        raise ValueError(f"instances {sorted(instances)} are not all in the {split} split {split_inst}")
    labels = _grid(range(len(CATEGORIES)) if categories is None else categories,
                   split_inst if instances is None else instances)
    keep = _select(labels, elevation=elevations, azimuth=azimuths, lighting=lightings)
    labels = {k: v[keep] for k, v in labels.items()}
    if index is not None:
        labels = {k: v[index] for k, v in labels.items()}
    if n is not None and n < labels["category"].numel():
        pick = torch.randperm(labels["category"].numel(), generator=torch.Generator().manual_seed(seed + 99991))[:n]
        labels = {k: v[pick.sort().values] for k, v in labels.items()}
    N = labels["category"].numel()
    images = torch.empty(N, 2, size, size, dtype=torch.uint8)
    # one task per object: the distinct viewpoints it needs
    obj = labels["category"] * 10 + labels["instance"]
    view = labels["elevation"] * 18 + labels["azimuth"]
    tasks = []
    for o in obj.unique().tolist():
        views = view[obj == o].unique()
        tasks.append((o // 10, o % 10, torch.stack([views // 18, views % 18], -1), size, seed, noise, camera, threads))
    if workers > 1 and len(tasks) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
            results = ex.map(_render_views, tasks)
            _fill(images, labels, obj, view, results)
    else:
        _fill(images, labels, obj, view, map(_render_views, tasks))
    return {"images": images, **labels}


def _fill(images, labels, obj, view, results) -> None:
    for category, instance, el, az, img in results:
        rows = (obj == category * 10 + instance).nonzero().flatten()
        vkey = (el * 18 + az).tolist()
        pos = {k: i for i, k in enumerate(vkey)}
        vi = torch.tensor([pos[int(v)] for v in view[rows]])
        images[rows] = img[vi, labels["lighting"][rows]]


def viewpoint_split(ds: ImageDataset, axis: str = "azimuth", familiar: Sequence[int] | None = None
                    ) -> tuple[ImageDataset, ImageDataset]:
    """Split a dataset with smallNORB label fields into (familiar, novel) viewpoints.

    ``axis="azimuth"``: ``familiar`` azimuth indices, default :data:`HINTON_AZIMUTHS_FAMILIAR`
    (300, 320, 340, 0, 20, 40 degrees); ``axis="elevation"``: default the 3 lowest elevations
    (:data:`HINTON_ELEVATIONS_FAMILIAR`). This is the novel-viewpoint protocol of Hinton, Sabour & Frosst
    (2018): train on the familiar views of the training instances, test on the test instances at familiar
    and at novel views. Works for the real smallNORB and for the rendered set.
    """
    if axis not in ("azimuth", "elevation"):
        raise ValueError(f"axis must be 'azimuth' or 'elevation', got {axis!r}")
    if axis not in ds.extra:
        raise ValueError(f"dataset {ds.name} has no {axis!r} label field")
    fam = familiar if familiar is not None else (HINTON_AZIMUTHS_FAMILIAR if axis == "azimuth" else HINTON_ELEVATIONS_FAMILIAR)
    m = torch.isin(ds.extra[axis], torch.as_tensor(list(fam)))
    a, b = ds.subset(m.nonzero().flatten()), ds.subset((~m).nonzero().flatten())
    a.description = f"{ds.description} [familiar {axis}s {sorted(fam)}]"
    b.description = f"{ds.description} [novel {axis}s]"
    return a, b


def _cache_key(**kw: Any) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(kw, sort_keys=True, default=str).encode()).hexdigest()[:16]


@register_dataset("rendered_norb")
def _load_rendered_norb(root: Path, split: str, download: bool, *, n: int | None = None, seed: int = 0,
                        categories: Sequence[int] | None = None, instances: Sequence[int] | None = None,
                        elevations: Sequence[int] | None = None, azimuths: Sequence[int] | None = None,
                        lightings: Sequence[int] | None = None, size: int = 96, noise: float = 2.0,
                        val_size: int = 2430, workers: int = 1, cache: bool = False, **_: Any) -> ImageDataset:
    """``get_dataset("rendered_norb", root, split, ...)``: the GENERATED smallNORB-like set.

    Splits as smallNORB: ``train_full`` = training instances 4, 6, 7, 8, 9 (24,300 stereo pairs),
    ``val`` = a fixed random ``val_size`` of them, ``train`` = the rest, ``test`` = instances 0, 1, 2, 3, 5.
    Filters and ``n`` as in :func:`render_norb_like`. ``cache=True`` keeps the rendered arrays in
    ``<root>/rendered_norb/`` (written atomically) and reuses them.
    """
    _check_split(split)
    part = "test" if split == "test" else "train"
    index = None
    if split in ("train", "val"):
        tr, va = train_val_indices(len(CATEGORIES) * 5 * 9 * 18 * N_LIGHTINGS, val_size, seed=12345 + seed)
        index = tr if split == "train" else va
        # filters apply after the val split: turn the grid positions into a mask over the filtered grid
    kw = dict(split=part, categories=categories, instances=instances, elevations=elevations, azimuths=azimuths,
              lightings=lightings, size=size, seed=seed, noise=noise)
    if index is not None:
        full = _grid(range(len(CATEGORIES)), TRAIN_INSTANCES)
        inside = torch.zeros(full["category"].numel(), dtype=torch.bool)
        inside[index] = True
        keep = _select(full, category=categories, instance=instances, elevation=elevations, azimuth=azimuths,
                       lighting=lightings)
        index = inside[keep].nonzero().flatten()
    path = root / "rendered_norb" / f"{split}_{_cache_key(n=n, val_size=val_size, **kw)}.pt"
    data = None
    if cache and path.exists():
        data = torch.load(path, weights_only=True)
    if data is None:
        data = render_norb_like(**kw, n=n, index=index, workers=workers)
        if cache:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + f".tmp{os.getpid()}")
            torch.save(data, tmp)
            os.replace(tmp, path)
    extra = {k: data[k] for k in _FIELDS if k != "category"}
    return ImageDataset(
        "rendered_norb", split, data["images"], data["category"], list(CATEGORIES), generated=True,
        description=("GENERATED smallNORB-like stereo pairs (simple ray-cast 3-D objects at smallNORB's 9 "
                     "elevations x 18 azimuths x 6 lightings, split by instance like smallNORB); not smallNORB."),
        extra=extra)
