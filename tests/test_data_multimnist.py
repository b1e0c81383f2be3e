"""MultiMNIST (Sabour and Efficient-CapsNet recipes) and affine-MNIST: statistics, determinism, sources."""

import gzip
import struct

import numpy as np
import pytest
import torch

from capsule_lib.data import DatasetUnavailableError, get_dataset
from capsule_lib.data.affine_mnist import make_affine_mnist
from capsule_lib.data.affnist import center_pad
from capsule_lib.data.multimnist import bbox_overlap, bounding_boxes, make_multimnist, overlap_stats
from capsule_lib.data.transforms import shift_images


def digits(n=200, seed=0):
    """Random 'digits': a filled rectangle of random size somewhere in the central 20x20 box."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 1, 28, 28, dtype=torch.uint8)
    for i in range(n):
        h, w = torch.randint(6, 20, (2,), generator=g).tolist()
        t, l = (
            4 + torch.randint(0, 21 - h, (1,), generator=g).item(),
            4 + torch.randint(0, 21 - w, (1,), generator=g).item(),
        )
        x[i, 0, t : t + h, l : l + w] = torch.randint(60, 256, (h, w), generator=g, dtype=torch.uint8)
    return x, torch.arange(n) % 10


def shift_2d_official(image: np.ndarray, shift, max_shift: int) -> np.ndarray:
    """The official mnist_shift.py shift (pad by max_shift + 1, roll, crop), re-derived here."""
    m = max_shift + 1
    p = np.pad(image, m, "constant")
    p = np.roll(p, shift[0], axis=0)
    p = np.roll(p, shift[1], axis=1)
    return p[m:-m, m:-m]


@pytest.mark.parametrize("variant,shift", [("sabour", 4), ("efficient", 6)])
def test_recipe_statistics(variant, shift):
    x, y = digits(300)
    d = make_multimnist(x, y, n=3000, variant=variant, seed=3)
    assert d["merged"].shape == (3000, 1, 36, 36) and d["merged"].dtype == torch.uint8
    # pairs of different classes, base digits used equally often, partner classes all represented
    assert (d["label_a"] != d["label_b"]).all()
    assert torch.bincount(d["index_a"], minlength=300).unique().tolist() == [10]
    assert torch.bincount(d["label_a"]).tolist() == [300] * 10
    pc = torch.bincount(d["label_b"], minlength=10).float() / 3000
    assert pc.min() > 0.07 and pc.max() < 0.13
    # shifts: integers in [-shift, shift] on both axes, the whole range used
    sh = torch.cat([d["shift_a"], d["shift_b"]])
    assert sh.min() == -shift and sh.max() == shift and set(sh.flatten().tolist()) == set(range(-shift, shift + 1))
    # merged = min(a + b, 255); sources = padded digit shifted as the official code does
    assert torch.equal(d["merged"], (d["source_a"].int() + d["source_b"].int()).clamp(max=255).to(torch.uint8))
    for k in range(0, 3000, 397):
        i = int(d["index_a"][k])
        dx, dy = d["shift_a"][k].tolist()
        ref = shift_2d_official(np.pad(x[i, 0].numpy(), 4), (dy, dx), shift)
        assert np.array_equal(d["source_a"][k, 0].numpy(), ref)
        assert d["label_a"][k] == y[i] and d["label_b"][k] == y[int(d["index_b"][k])]


def test_overlap_statistics_and_known_boxes():
    a = torch.zeros(2, 1, 10, 10, dtype=torch.uint8)
    b = torch.zeros(2, 1, 10, 10, dtype=torch.uint8)
    a[0, 0, 0:4, 0:4] = 1  # 16 px box
    b[0, 0, 2:6, 2:6] = 1  # overlaps a 2x2 corner
    a[1, 0, 0:2, 0:2] = 1
    b[1, 0, 5:7, 5:7] = 1  # disjoint
    assert bounding_boxes(a).tolist() == [[0, 3, 0, 3], [0, 1, 0, 1]]
    ov = bbox_overlap(a, b)
    assert torch.allclose(ov["iou"], torch.tensor([4 / 28, 0.0])) and torch.allclose(
        ov["inter_over_min"], torch.tensor([4 / 16, 0.0])
    )
    x, y = digits(300)
    s4 = overlap_stats(make_multimnist(x, y, n=2000, variant="sabour", seed=0))
    s6 = overlap_stats(make_multimnist(x, y, n=2000, variant="efficient", seed=0))
    assert s4["max_abs_shift"] == 4 and s6["max_abs_shift"] == 6
    assert 0 < s6["iou_mean"] < s4["iou_mean"] < 1  # larger shifts -> less overlap
    assert s4["inter_over_min_p05"] <= s4["inter_over_min_median"] <= s4["inter_over_min_p95"]
    assert s4["any_overlap"] > s6["any_overlap"] > 0.5


def test_determinism_and_same_class_option():
    x, y = digits(100)
    a = make_multimnist(x, y, n=500, seed=7)
    b = make_multimnist(x, y, n=500, seed=7)
    c = make_multimnist(x, y, n=500, seed=8)
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["merged"], c["merged"])
    s = make_multimnist(x, y, n=2000, seed=1, allow_same_class=True, variant="efficient")
    assert (s["index_a"] != s["index_b"]).all() and (s["label_a"] == s["label_b"]).any()
    with pytest.raises(ValueError, match="variant"):
        make_multimnist(x, y, variant="hinton")


def test_registry_glyph_source_and_offline_fallback(tmp_path, monkeypatch):
    ds = get_dataset("multimnist", tmp_path, "test", source="glyph_digits", n=200, variant="efficient")
    assert ds.generated and "glyph_digits (NOT MNIST)" in ds.description and "GENERATED" in ds.banner()
    assert ds.images.shape == (200, 1, 36, 36) and ds.labels.shape == (200, 10)
    assert (ds.labels.sum(1) == 2).all()
    assert (ds.labels.gather(1, ds.extra["label_a"][:, None]) == 1).all()
    assert (ds.labels.gather(1, ds.extra["label_b"][:, None]) == 1).all()
    assert {"source_a", "source_b", "label_a", "label_b", "shift_a", "shift_b"} <= set(ds.extra)
    sub = ds.subset(torch.arange(10))
    assert sub.extra["source_a"].shape == (10, 1, 36, 36)
    # no MNIST under the root: offline -> built from glyph_digits; online but no download -> clear error
    off = get_dataset("multimnist", tmp_path, "test", n=50, offline=True)
    assert "glyph_digits" in off.description
    with pytest.raises(DatasetUnavailableError) as e:
        get_dataset("multimnist", tmp_path, "test", download=False)
    msg = str(e.value)
    assert "multimnist" in msg and "python data_scripts/mnist.py" in msg and "CAPSULE_OFFLINE=1" in msg
    with pytest.raises(DatasetUnavailableError, match="affine_mnist"):
        get_dataset("affine_mnist", tmp_path, "test", download=False)


def _write_idx(path, arr):
    header = struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_real_mnist_source_when_present(tmp_path):
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    x, y = digits(40)
    _write_idx(raw / "t10k-images-idx3-ubyte.gz", x[:, 0].numpy())
    _write_idx(raw / "t10k-labels-idx1-ubyte.gz", y.numpy())
    ds = get_dataset("multimnist", tmp_path, "test", seed=2)
    assert len(ds) == 40 and "real MNIST" in ds.description
    assert torch.equal(ds.extra["index_a"], torch.arange(40))
    again = get_dataset("multimnist", tmp_path, "test", seed=2)
    assert torch.equal(ds.images, again.images)
    other = get_dataset("multimnist", tmp_path, "test", seed=3)
    assert not torch.equal(ds.images, other.images)
    am = get_dataset("affine_mnist", tmp_path, "test", n=20)
    assert am.images.shape == (20, 1, 40, 40) and "real MNIST" in am.description and am.generated
    assert torch.equal(am.labels, y[:20])


def test_affine_mnist_ranges_identity_and_translation():
    x, y = digits(64)
    d = make_affine_mnist(x, seed=0)
    assert d["images"].shape == (64, 1, 40, 40)
    assert d["rotation"].abs().max() <= 20 and d["shear"].abs().max() <= 0.1
    for k in ("scale_x", "scale_y"):
        assert d[k].min() >= 0.8 and d[k].max() <= 1.2
    assert d["rotation"].std() > 5  # spread over the range
    box = bounding_boxes(d["images"])
    assert (box[:, 0] >= 0).all() and (box[:, 1] <= 39).all() and (box[:, 2] >= 0).all() and (box[:, 3] <= 39).all()
    assert d["shift_x"].abs().max() > 3  # "significant translations"
    # identity linear part: plain centring, then a pure integer shift
    ident = make_affine_mnist(x, seed=0, rotation=0.0, shear=0.0, scale=(1.0, 1.0), translate=False)
    assert torch.equal(ident["images"], center_pad(x, 40))
    moved = make_affine_mnist(x, seed=4, rotation=0.0, shear=0.0, scale=(1.0, 1.0))
    assert torch.equal(moved["images"], shift_images(center_pad(x, 40), moved["shift_x"], moved["shift_y"]))
    # a 90-degree-free check of the rotation: rotating changes the image, the ink stays similar
    rot = make_affine_mnist(x, seed=1, rotation=20.0, shear=0.0, scale=(1.0, 1.0), translate=False)
    assert not torch.equal(rot["images"], ident["images"])
    ink0, ink1 = ident["images"].float().sum((1, 2, 3)), rot["images"].float().sum((1, 2, 3))
    assert ((ink1 / ink0) - 1).abs().max() < 0.15
    same = make_affine_mnist(x, seed=0)
    assert torch.equal(same["images"], d["images"])


@pytest.mark.realdata
def test_multimnist_from_real_mnist_overlap(real_data):
    ds = get_dataset("multimnist", real_data, "test", n=5000)
    s = overlap_stats(ds)
    assert "real MNIST" in ds.description and s["max_abs_shift"] == 4
    assert 0.6 < s["inter_over_min_mean"] < 0.9  # digits' boxes overlap heavily (paper: "80 % on average")
