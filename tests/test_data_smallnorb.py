"""smallNORB: the binary matrix format (on files written here byte by byte), the loader and the papers'
preprocessing transforms."""

import gzip
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from capsule_lib.data import DatasetUnavailableError, get_dataset
from capsule_lib.data.smallnorb import (
    EfficientNorbTransform,
    NorbFormatError,
    channel_stats,
    heinsen_transform,
    hinton_transform,
    load_smallnorb_arrays,
    read_norb_matrix,
    shift_edge,
    stereo_as_samples,
    write_norb_matrix,
)
from capsule_lib.functional import add_coordinate_channels

BYTE, INT, SHORT, SINGLE, DOUBLE = 0x1E3D4C55, 0x1E3D4C54, 0x1E3D4C56, 0x1E3D4C51, 0x1E3D4C53
TRAIN = "smallnorb-5x46789x9x18x6x2x96x96-training"
TEST = "smallnorb-5x01235x9x18x6x2x96x96-testing"


def norb_bytes(magic: int, dims: list[int], payload: bytes) -> bytes:
    """The format, spelled out independently of the library: little-endian int32 magic, int32 ndim, then
    max(3, ndim) int32 dimensions (unused ones = 1), then the data."""
    shown = list(dims) + [1] * (3 - len(dims))
    return struct.pack("<i", magic) + struct.pack("<i", len(dims)) + struct.pack(f"<{len(shown)}i", *shown) + payload


def write(path, blob, gz=None):
    gz = str(path).endswith(".gz") if gz is None else gz
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(blob)
    else:
        path.write_bytes(blob)


def fake_split(folder, prefix, n, seed=0, gz=True, instances=(4, 6, 7, 8, 9)):
    """Write dat/cat/info files of ``n`` pairs in the official format; returns the arrays written."""
    rng = np.random.default_rng(seed)
    dat = rng.integers(0, 256, (n, 2, 96, 96), dtype=np.uint8)
    cat = (np.arange(n) % 5).astype("<i4")
    info = np.stack(
        [
            np.array(instances)[np.arange(n) % len(instances)],
            np.arange(n) % 9,
            2 * (np.arange(n) % 18),
            np.arange(n) % 6,
        ],
        1,
    ).astype("<i4")
    ext = ".mat.gz" if gz else ".mat"
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / f"{prefix}-dat{ext}", norb_bytes(BYTE, [n, 2, 96, 96], dat.tobytes()))
    write(folder / f"{prefix}-cat{ext}", norb_bytes(INT, [n], cat.tobytes()))
    write(folder / f"{prefix}-info{ext}", norb_bytes(INT, [n, 4], info.tobytes()))
    return dat, cat, info


@pytest.mark.parametrize("magic,dtype", [(BYTE, "u1"), (INT, "<i4"), (SHORT, "<i2"), (SINGLE, "<f4"), (DOUBLE, "<f8")])
@pytest.mark.parametrize("shape", [(5,), (3, 4), (2, 3, 4), (2, 2, 3, 3)])
def test_reads_every_element_type_and_rank(tmp_path, magic, dtype, shape):
    a = (np.arange(int(np.prod(shape))) - 3).astype(dtype).reshape(shape)
    if dtype == "u1":
        a = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape)
    p = tmp_path / "m.mat"
    write(p, norb_bytes(magic, list(shape), a.tobytes()), gz=False)
    b = read_norb_matrix(p)
    assert b.shape == shape and b.dtype.kind == np.dtype(dtype).kind and np.array_equal(a, b)
    # the header of a rank-1/2 matrix still stores 3 dimensions (20 bytes): data starts at byte 20
    assert p.stat().st_size == 8 + 4 * max(3, len(shape)) + a.nbytes


def test_writer_round_trip_and_exact_bytes(tmp_path):
    a = np.arange(12, dtype=np.int32).reshape(3, 4)
    write_norb_matrix(tmp_path / "x.mat", a)
    assert (tmp_path / "x.mat").read_bytes() == norb_bytes(INT, [3, 4], a.astype("<i4").tobytes())
    write_norb_matrix(tmp_path / "y.mat.gz", a)
    assert np.array_equal(read_norb_matrix(tmp_path / "y.mat.gz"), a)
    with pytest.raises(ValueError, match="no NORB magic"):
        write_norb_matrix(tmp_path / "z.mat", np.zeros(3, dtype=np.complex64))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.mat", "y.mat.gz"]  # nothing half-written


def test_writer_leaves_nothing_when_the_rename_fails(tmp_path, monkeypatch):
    import capsule_lib.data.smallnorb as sn

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(sn.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_norb_matrix(tmp_path / "a.mat", np.zeros((2, 2), np.uint8))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "damage,match",
    [
        (
            lambda b: b[:-1],
            r"truncated: shape \(2, 3, 4\) of uint8 needs 24 data bytes after the 20-byte header, found 23",
        ),
        (lambda b: b + b"\x00", "too long"),
        (lambda b: b[:12], "truncated header"),
        (lambda b: b[:5], "truncated NORB matrix"),
        (lambda b: struct.pack("<i", 0x12345678) + b[4:], "bad magic number 0x12345678"),
        (lambda b: struct.pack("<i", 0x1E3D4C52) + b[4:], "packed"),
        (lambda b: b[:4] + struct.pack("<i", -1) + b[8:], "implausible number of dimensions"),
    ],
)
def test_truncated_and_corrupted_files_raise_clear_errors_and_write_nothing(tmp_path, damage, match):
    good = norb_bytes(BYTE, [2, 3, 4], bytes(range(24)))
    p = tmp_path / "bad.mat"
    p.write_bytes(damage(good))
    before = sorted(tmp_path.iterdir())
    with pytest.raises(NorbFormatError, match=match) as e:
        read_norb_matrix(p)
    assert "bad.mat" in str(e.value)
    assert sorted(tmp_path.iterdir()) == before


def test_truncated_gzip_stream_is_a_format_error(tmp_path):
    p = tmp_path / "t.mat.gz"
    payload = np.random.default_rng(0).integers(0, 256, 4 * 2 * 96 * 96, dtype=np.uint8).tobytes()
    write(p, norb_bytes(BYTE, [4, 2, 96, 96], payload))
    p.write_bytes(p.read_bytes()[:2000])
    with pytest.raises(NorbFormatError, match="cannot read"):
        read_norb_matrix(p)


def test_loader_on_fabricated_official_files(tmp_path):
    root = tmp_path
    dat, cat, info = fake_split(root / "smallnorb", TRAIN, 30, seed=1, gz=True)
    tdat, tcat, tinfo = fake_split(root / "smallnorb", TEST, 20, seed=2, gz=False, instances=(0, 1, 2, 3, 5))
    full = get_dataset("smallnorb", root, "train_full", expected=None)
    assert full.images.shape == (30, 2, 96, 96) and full.images.dtype == torch.uint8
    assert np.array_equal(full.images.numpy(), dat) and np.array_equal(full.labels.numpy(), cat)
    assert np.array_equal(full.extra["instance"].numpy(), info[:, 0])
    assert np.array_equal(full.extra["elevation"].numpy(), info[:, 1])
    assert np.array_equal(full.extra["azimuth"].numpy(), info[:, 2] // 2)  # 0, 2, ..., 34 -> index 0..17
    assert np.array_equal(full.extra["lighting"].numpy(), info[:, 3])
    assert full.classes == ["animal", "human", "airplane", "truck", "car"] and not full.generated
    te = get_dataset("smallnorb", root, "test", expected=None)
    assert len(te) == 20 and np.array_equal(te.images.numpy(), tdat)
    assert set(te.extra["instance"].tolist()).isdisjoint(full.extra["instance"].tolist())
    tr = get_dataset("smallnorb", root, "train", expected=None, val_size=6)
    va = get_dataset("smallnorb", root, "val", expected=None, val_size=6)
    assert len(tr) == 24 and len(va) == 6 and tr.split == "train" and va.split == "val"
    both = torch.cat([tr.images, va.images]).flatten(1).sum(1).sort().values
    assert torch.equal(both, full.images.flatten(1).sum(1).sort().values)
    # the official files must hold 24,300 pairs: a smaller set is refused unless expected=None
    with pytest.raises(NorbFormatError, match="24300"):
        get_dataset("smallnorb", root, "test")


def test_loader_cross_checks_the_three_files(tmp_path):
    folder = tmp_path / "smallnorb"
    fake_split(folder, TRAIN, 10)
    info = np.zeros((9, 4), "<i4")  # one row short
    write(folder / f"{TRAIN}-info.mat.gz", norb_bytes(INT, [9, 4], info.tobytes()))
    with pytest.raises(NorbFormatError, match="10 image pairs but 10 categories and 9 info rows"):
        load_smallnorb_arrays(folder, "train", expected=None)
    bad = np.zeros((10, 4), "<i4")
    bad[0, 2] = 3  # odd azimuth
    write(folder / f"{TRAIN}-info.mat.gz", norb_bytes(INT, [10, 4], bad.tobytes()))
    with pytest.raises(NorbFormatError, match="odd azimuth"):
        load_smallnorb_arrays(folder, "train", expected=None)
    write(folder / f"{TRAIN}-cat.mat.gz", norb_bytes(INT, [10], (np.arange(10) + 3).astype("<i4").tobytes()))
    with pytest.raises(NorbFormatError, match="category values outside 0..4"):
        load_smallnorb_arrays(folder, "train", expected=None)
    write(folder / f"{TRAIN}-dat.mat.gz", norb_bytes(INT, [2, 2], bytes(16)))
    with pytest.raises(NorbFormatError, match=r"uint8 \[N, 2, 96, 96\]"):
        load_smallnorb_arrays(folder, "train", expected=None)


def test_missing_smallnorb_names_dataset_script_and_offline_option(tmp_path, monkeypatch):
    with pytest.raises(DatasetUnavailableError) as e:  # standin=False: the library's error, not the fallback
        get_dataset("smallnorb", tmp_path, "train", standin=False, offline=True)
    msg = str(e.value)
    assert (
        "smallnorb" in msg
        and f"python data_scripts/smallnorb.py --root {tmp_path}" in msg
        and "CAPSULE_OFFLINE=1" in msg
    )
    with pytest.raises(DatasetUnavailableError, match="data_scripts/smallnorb.py"):
        get_dataset("smallnorb", tmp_path, "test", download=False)


# ------------------------------------------------------------------------------------------ preprocessing
def test_coordinate_channels_and_edge_shift_match_a_reference():
    x = torch.rand(3, 2, 6, 7)
    c = add_coordinate_channels(x)
    assert c.shape == (3, 4, 6, 7) and torch.equal(c[:, :2], x)
    assert torch.allclose(c[0, 2, :, 0], torch.linspace(-1, 1, 6)) and torch.allclose(
        c[0, 3, 0], torch.linspace(-1, 1, 7)
    )
    dx, dy = torch.tensor([2, -3, 0]), torch.tensor([-1, 2, 3])
    out = shift_edge(x, dx, dy)
    m = 4
    for b in range(3):  # RandomCrop(padding=m, padding_mode="edge") with offset (m - dy, m - dx)
        padded = np.pad(x[b].numpy(), ((0, 0), (m, m), (m, m)), mode="edge")
        ref = padded[:, m - dy[b] : m - dy[b] + 6, m - dx[b] : m - dx[b] + 7]
        assert np.allclose(out[b].numpy(), ref)


def test_heinsen_transform_shapes_and_shift_range():
    # every pixel value unique, so the shift of an output can be read off its centre pixel
    x = (torch.arange(96 * 96, dtype=torch.float32) / (96 * 96)).view(1, 1, 96, 96).repeat(8, 2, 1, 1)
    g = torch.Generator().manual_seed(0)
    (tr, y) = heinsen_transform(True)((x, torch.arange(8)), g)
    (te, _) = heinsen_transform(False)((x, torch.arange(8)))
    assert tr.shape == te.shape == (8, 4, 96, 96) and torch.equal(y, torch.arange(8))
    assert torch.equal(te[:, :2], x)  # test images are not shifted
    shifts = set()
    for b in range(8):  # each training image is an edge-filled shift of the original by at most 16 px
        src = int(round(tr[b, 0, 48, 48].item() * 96 * 96))
        dy, dx = 48 - src // 96, 48 - src % 96
        assert abs(dx) <= 16 and abs(dy) <= 16
        assert torch.equal(shift_edge(x[b : b + 1], torch.tensor([dx]), torch.tensor([dy]))[0], tr[b, :2])
        shifts.add((dx, dy))
    assert len(shifts) > 1


def test_channel_stats_and_efficient_transform():
    x = torch.randint(0, 256, (6, 2, 96, 96), dtype=torch.uint8)
    mean, std = channel_stats(x, chunk=4)
    ref = x.double() / 255
    assert torch.allclose(mean.double(), ref.mean(dim=(0, 2, 3)), atol=1e-6)
    assert torch.allclose(std.double(), ref.std(dim=(0, 2, 3), unbiased=False), atol=1e-6)
    xf = x.float() / 255
    (te, _) = EfficientNorbTransform(mean, std, train=False)((xf, None))
    z = F.interpolate(
        (xf - mean.view(1, 2, 1, 1)) / std.view(1, 2, 1, 1), size=(64, 64), mode="bilinear", align_corners=False
    )
    assert te.shape == (6, 2, 48, 48) and torch.allclose(te, z[:, :, 8:56, 8:56], atol=1e-5)
    # without brightness/contrast jitter a training image is a 48x48 crop of the same 64x64 image
    g = torch.Generator().manual_seed(1)
    (tr, _) = EfficientNorbTransform(mean, std, train=True, max_delta=0.0, contrast=(1.0, 1.0))((xf, None), g)
    for b in range(6):
        assert any(
            torch.allclose(tr[b], z[b, :, i : i + 48, j : j + 48], atol=1e-5) for i in range(17) for j in range(17)
        )
    # jitter: brightness shifts the mean by up to 2, contrast scales the deviation by 0.5-1.5
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    (a, _) = EfficientNorbTransform(mean, std, train=True)((xf, None), g1)
    (b_, _) = EfficientNorbTransform(mean, std, train=True)((xf, None), g2)
    assert torch.equal(a, b_)  # reproducible under a generator
    assert not torch.allclose(a, tr)


def test_hinton_transform_resize_crop_and_jitter():
    x = torch.rand(5, 1, 96, 96)
    (te, _) = hinton_transform(False)((x, None))
    r = F.interpolate(x, size=(48, 48), mode="bilinear", align_corners=False, antialias=True)
    assert te.shape == (5, 1, 32, 32) and torch.allclose(te, r[:, :, 8:40, 8:40])
    g = torch.Generator().manual_seed(0)
    (tr, _) = hinton_transform(True, brightness=0.0, contrast=0.0)((x, None), g)
    for b in range(5):
        assert any(torch.allclose(tr[b], r[b, :, i : i + 32, j : j + 32]) for i in range(17) for j in range(17))
    (jit, _) = hinton_transform(True)((x, None), torch.Generator().manual_seed(0))
    assert jit.shape == (5, 1, 32, 32) and jit.min() >= 0 and jit.max() <= 1 and not torch.allclose(jit, tr)


def test_stereo_as_samples(tmp_path):
    fake_split(tmp_path / "smallnorb", TRAIN, 10)
    ds = get_dataset("smallnorb", tmp_path, "train_full", expected=None)
    s = stereo_as_samples(ds)
    assert s.images.shape == (20, 1, 96, 96)
    assert torch.equal(s.images[0, 0], ds.images[0, 0]) and torch.equal(s.images[1, 0], ds.images[0, 1])
    assert torch.equal(s.labels[::2], ds.labels) and torch.equal(s.extra["azimuth"][1::2], ds.extra["azimuth"])
    assert s.extra["camera"].tolist()[:4] == [0, 1, 0, 1]
