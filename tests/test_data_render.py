"""The rendered smallNORB-like set: ray-casting against analytic answers, viewpoint coverage, the instance
split, determinism, stereo/lighting/viewpoint effects and the viewpoint-generalisation split."""

import math

import pytest
import torch

from capsule_lib.data import get_dataset, raycast
from capsule_lib.data import render as R


def _prims(kind, size, center=(0.0, 0.0, 0.0)):
    return R.Primitives(
        torch.tensor([kind]), torch.tensor([center]), torch.eye(3)[None], torch.tensor([size]), torch.tensor([0.8])
    )


@pytest.mark.parametrize(
    "kind,size,axis,expected",
    [
        (R.ELLIPSOID, (0.5, 0.5, 0.5), 2, 4.5),  # sphere r = 0.5 seen from 5 along z
        (R.ELLIPSOID, (0.3, 0.7, 0.9), 0, 4.7),  # ellipsoid: the x radius faces a camera on the x axis
        (R.BOX, (1.0, 0.5, 0.25), 1, 4.5),
        (R.CYLINDER, (0.4, 0.4, 0.8), 2, 4.2),  # along the axis: the cap at z = 0.8
        (R.CYLINDER, (0.4, 0.6, 0.8), 1, 4.4),  # across: the side, y radius 0.6
    ],
)
def test_trace_matches_analytic_hit_distances(kind, size, axis, expected):
    o = torch.zeros(1, 3)
    o[0, axis] = 5.0
    d = torch.zeros(1, 2, 3)
    d[0, 0, axis] = -1.0  # straight at the centre
    d[0, 1] = torch.tensor([0.6, 0.8, 0.0]) if axis == 2 else torch.tensor([0.0, 0.0, 1.0])  # misses
    t, which = R.trace(o, d, _prims(kind, size))
    assert t[0, 0].item() == pytest.approx(expected, abs=1e-5) and which[0, 0] == 0
    assert math.isinf(t[0, 1].item()) and which[0, 1] == -1
    n = raycast._normals(o + t[0, :1, None] * d[0, :1], which[0, :1], _prims(kind, size))
    assert torch.allclose(n, -d[0, :1], atol=1e-5)  # the normal faces the camera


def test_trace_takes_the_nearest_of_several_primitives():
    p = R.Primitives(
        torch.tensor([R.ELLIPSOID, R.BOX]),
        torch.tensor([[0.0, 0, 0], [0.0, 0, 1.5]]),
        torch.eye(3).repeat(2, 1, 1),
        torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.2, 0.2]]),
        torch.tensor([0.5, 0.9]),
    )
    t, which = R.trace(torch.tensor([[0.0, 0, 5]]), torch.tensor([[[0.0, 0, -1]]]), p)
    assert which.item() == 1 and t.item() == pytest.approx(5 - 1.7, abs=1e-5)


def test_grid_covers_smallnorb_viewpoints_and_instance_split():
    tr, te = R.norb_grid("train"), R.norb_grid("test")
    assert len(tr["category"]) == len(te["category"]) == 24300
    assert set(tr["instance"].tolist()) == {4, 6, 7, 8, 9} and set(te["instance"].tolist()) == {0, 1, 2, 3, 5}
    for g in (tr, te):
        key = (((g["category"] * 10 + g["instance"]) * 9 + g["elevation"]) * 18 + g["azimuth"]) * 6 + g["lighting"]
        assert key.unique().numel() == 24300  # every (object, elevation, azimuth, lighting) exactly once
        assert torch.bincount(g["category"]).tolist() == [4860] * 5
        assert torch.bincount(g["elevation"]).tolist() == [2700] * 9
        assert torch.bincount(g["azimuth"]).tolist() == [1350] * 18
        assert torch.bincount(g["lighting"]).tolist() == [4050] * 6
    assert R.ELEVATIONS_DEG == tuple(range(30, 71, 5)) and R.AZIMUTHS_DEG == tuple(range(0, 341, 20))


@pytest.fixture(scope="module")
def small():
    # one instance per category, 2 elevations x 3 azimuths x 6 lightings: 180 stereo pairs in about a second
    return R.render_norb_like("train", instances=[6], elevations=[0, 8], azimuths=[0, 1, 9])


def test_small_render_fields_and_content(small):
    x = small["images"]
    assert x.shape == (180, 2, 96, 96) and x.dtype == torch.uint8
    for k in ("category", "instance", "elevation", "azimuth", "lighting"):
        assert small[k].shape == (180,) and small[k].dtype == torch.int64
    assert torch.bincount(small["category"]).tolist() == [36] * 5
    # objects are visible: a bright/dark region distinct from the (nearly uniform) background
    bg = x[:, :, :3, :3].float().mean((2, 3))  # corner
    centre = x[:, :, 40:56, 40:56].float()
    assert ((centre - bg[..., None, None]).abs().amax((2, 3)) > 30).all()
    assert (x.float().std((2, 3)) > 5).all()

    def pick(**f):
        m = torch.ones(180, dtype=torch.bool)
        for k, v in f.items():
            m &= small[k] == v
        return x[m.nonzero().flatten()[0]].float()

    a = pick(category=2, elevation=0, azimuth=0, lighting=0)
    assert (a[0] - a[1]).abs().mean() > 1  # the two cameras see different images (stereo)
    assert (a - pick(category=2, elevation=0, azimuth=0, lighting=3)).abs().mean() > 3  # lighting matters
    assert (a - pick(category=2, elevation=0, azimuth=9, lighting=0)).abs().mean() > 3  # azimuth matters
    assert (a - pick(category=2, elevation=8, azimuth=0, lighting=0)).abs().mean() > 3  # elevation matters
    assert (a - pick(category=3, elevation=0, azimuth=0, lighting=0)).abs().mean() > 3  # categories differ


def test_determinism_seed_and_subset_consistency(small):
    again = R.render_norb_like("train", instances=[6], elevations=[0], azimuths=[9], categories=[1, 4])
    m = torch.isin(small["category"], torch.tensor([1, 4])) & (small["elevation"] == 0) & (small["azimuth"] == 9)
    assert torch.equal(again["images"], small["images"][m])  # a sample does not depend on what else is rendered
    other = R.render_norb_like("train", instances=[6], elevations=[0], azimuths=[9], categories=[1, 4], seed=1)
    assert not torch.equal(other["images"], again["images"])
    n = R.render_norb_like("test", n=7, azimuths=[3])
    n2 = R.render_norb_like("test", n=7, azimuths=[3])
    assert torch.equal(n["images"], n2["images"]) and len(n["images"]) == 7 and (n["azimuth"] == 3).all()
    with pytest.raises(ValueError, match="not all in the train split"):
        R.render_norb_like("train", instances=[0])


def test_instances_differ_within_a_category():
    objs = [R.make_object(0, i) for i in range(10)]
    sizes = torch.stack([o.size.flatten() for o in objs])
    assert torch.cdist(sizes, sizes).fill_diagonal_(1).min() > 1e-3
    for o in objs:  # centred and scaled to bounding radius 1
        pts = o.surface_points()
        assert pts.norm(dim=-1).max().item() == pytest.approx(1.0, abs=1e-4)


def test_viewpoint_split_and_registry(tmp_path):
    ds = get_dataset(
        "rendered_norb", tmp_path, "test", instances=[0], lightings=[0], categories=[0, 2], elevations=[0, 4]
    )
    assert ds.generated and "GENERATED" in ds.banner() and ds.classes == R.CATEGORIES
    assert len(ds) == 2 * 2 * 18 and set(ds.extra) >= {"instance", "elevation", "azimuth", "lighting"}
    fam, nov = R.viewpoint_split(ds)
    assert set(fam.extra["azimuth"].tolist()) == {15, 16, 17, 0, 1, 2}  # 300, 320, 340, 0, 20, 40 degrees
    assert set(nov.extra["azimuth"].tolist()) == set(range(3, 15)) and len(fam) + len(nov) == len(ds)
    fe, ne = R.viewpoint_split(ds, "elevation")
    assert set(fe.extra["elevation"].tolist()) == {0} and set(ne.extra["elevation"].tolist()) == {4}
    with pytest.raises(ValueError, match="axis"):
        R.viewpoint_split(ds, "lighting")
    # train / val / train_full partition the training grid (val: a fixed random 2430)
    va = get_dataset("rendered_norb", tmp_path, "val", n=5)
    assert len(va) == 5 and set(va.extra["instance"].tolist()) <= {4, 6, 7, 8, 9}


def test_train_val_partition_without_rendering(tmp_path, monkeypatch):
    seen = {}

    def fake(**kw):
        seen[kw["split"] if "split" in kw else None] = kw
        idx = kw["index"]
        g = R.norb_grid("train")
        labels = {k: v[idx] if idx is not None else v for k, v in g.items()}
        return {"images": torch.zeros(len(labels["category"]), 2, 1, 1, dtype=torch.uint8), **labels}

    monkeypatch.setattr(R, "render_norb_like", fake)
    tr = get_dataset("rendered_norb", tmp_path, "train")
    va = get_dataset("rendered_norb", tmp_path, "val")
    full = get_dataset("rendered_norb", tmp_path, "train_full")
    assert len(tr) == 24300 - 2430 and len(va) == 2430 and len(full) == 24300

    def keys(d):
        e = d.extra
        return set(
            ((((d.labels * 10 + e["instance"]) * 9 + e["elevation"]) * 18 + e["azimuth"]) * 6 + e["lighting"]).tolist()
        )

    assert keys(tr).isdisjoint(keys(va)) and keys(tr) | keys(va) == keys(full)


def test_cache_round_trip(tmp_path, monkeypatch):
    a = get_dataset("rendered_norb", tmp_path, "test", instances=[1], elevations=[4], azimuths=[2], cache=True)
    files = list((tmp_path / "rendered_norb").iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"

    def boom(**kw):
        raise AssertionError("should have come from the cache")

    monkeypatch.setattr(R, "render_norb_like", boom)
    b = get_dataset("rendered_norb", tmp_path, "test", instances=[1], elevations=[4], azimuths=[2], cache=True)
    assert torch.equal(a.images, b.images) and torch.equal(a.extra["lighting"], b.extra["lighting"])
