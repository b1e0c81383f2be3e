import gzip
import struct

import numpy as np
import pytest
import torch

from capsule_lib.data import DatasetUnavailableError, get_dataset, read_idx, train_val_indices


def write_idx(path, arr: np.ndarray, gz=True):
    header = struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def fake_mnist(root, n_train=60, n_test=20):
    raw = root / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    write_idx(raw / "train-images-idx3-ubyte.gz", rng.integers(0, 256, (n_train, 28, 28)))
    write_idx(raw / "train-labels-idx1-ubyte.gz", np.arange(n_train) % 10)
    write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)), gz=False)
    write_idx(raw / "t10k-labels-idx1-ubyte", np.arange(n_test) % 10, gz=False)
    return raw


def test_idx_reader_and_mnist_splits(tmp_path):
    fake_mnist(tmp_path)
    tr = get_dataset("mnist", tmp_path, "train", val_size=10)
    va = get_dataset("mnist", tmp_path, "val", val_size=10)
    full = get_dataset("mnist", tmp_path, "train_full")
    te = get_dataset("mnist", tmp_path, "test")
    assert len(tr) == 50 and len(va) == 10 and len(full) == 60 and len(te) == 20
    assert tr.images.shape == (50, 1, 28, 28) and tr.images.dtype == torch.uint8
    assert not tr.generated
    # train and val are disjoint and together the full training set
    tr_i, va_i = train_val_indices(60, 10)
    assert set(tr_i.tolist()).isdisjoint(va_i.tolist())
    assert torch.equal(torch.cat([tr.labels, va.labels]).sort().values, full.labels.sort().values)


def test_idx_reader_rejects_truncated_and_wrong_magic(tmp_path):
    p = tmp_path / "x-idx3-ubyte"
    write_idx(p, np.zeros((2, 3, 3)), gz=False)
    p.write_bytes(p.read_bytes()[:-1])
    with pytest.raises(ValueError, match="expected 18 bytes"):
        read_idx(p)
    q = tmp_path / "y-idx3-ubyte"
    q.write_bytes(b"\x01\x02\x08\x01" + b"\x00" * 8)
    with pytest.raises(ValueError, match="magic"):
        read_idx(q)


def test_missing_mnist_offline_error_names_dataset_command_and_offline_option(tmp_path, monkeypatch):
    with pytest.raises(DatasetUnavailableError) as e:
        get_dataset("mnist", tmp_path / "nowhere", "test", standin=False, offline=True)
    msg = str(e.value)
    assert "mnist" in msg and "python data_scripts/mnist.py" in msg and "CAPSULE_OFFLINE=1" in msg


def test_unknown_dataset_and_split():
    with pytest.raises(ValueError, match="unknown dataset"):
        get_dataset("imagenet")
    with pytest.raises(ValueError, match="split"):
        get_dataset("glyph_digits", split="dev")


def test_glyph_digits_deterministic_balanced_and_distinct_splits():
    a = get_dataset("glyph_digits", split="train", n=500)
    b = get_dataset("glyph_digits", split="train", n=500)
    c = get_dataset("glyph_digits", split="test", n=500)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.images, c.images)
    assert a.generated and "GENERATED" in a.banner()
    counts = torch.bincount(a.labels, minlength=10)
    assert counts.min() == counts.max() == 50
    x = a.float_images()
    assert 0.05 < x.mean() < 0.3  # MNIST-like ink coverage (MNIST: 0.13)


def test_cifar_npz_layout(tmp_path):
    folder = tmp_path / "cifar10"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for k in range(5):
        np.savez_compressed(
            folder / f"train_{k}.npz",
            x=rng.integers(0, 256, (4, 32, 32, 3), dtype=np.uint8),
            y=np.arange(4, dtype=np.uint8),
        )
    np.savez_compressed(
        folder / "test.npz",
        x=rng.integers(0, 256, (6, 32, 32, 3), dtype=np.uint8),
        y=np.arange(6, dtype=np.uint8),
        exact=np.array([1, 1, 0, 0, 0, 0], bool),
    )
    te = get_dataset("cifar10", tmp_path, "test")
    assert te.images.shape == (6, 3, 32, 32) and te.extra["exact"].sum() == 2
    full = get_dataset("cifar10", tmp_path, "train_full")
    assert len(full) == 20


@pytest.mark.realdata
def test_real_mnist_statistics(real_data):
    te = get_dataset("mnist", real_data, "test")
    assert len(te) == 10000
    assert torch.bincount(te.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
    full = get_dataset("mnist", real_data, "train_full")
    assert abs(full.float_images().mean().item() - 0.1307) < 1e-3
