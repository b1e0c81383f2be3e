"""Loaders on fabricated files in the real formats: CIFAR python batches (the layout data_scripts/cifar*.py
extract), Fashion-MNIST IDX, the SST trees; plus the registry and its error messages."""

import gzip
import pickle
import struct

import numpy as np
import pytest
import torch

from capsule_lib.data import DatasetUnavailableError, available_datasets, get_dataset
from capsule_lib.data.sst import load_sst, parse_tree


def test_registry_names():
    assert {
        "smallnorb",
        "affnist",
        "multimnist",
        "affine_mnist",
        "rendered_norb",
        "mnist",
        "fashion_mnist",
        "cifar10",
        "cifar100",
        "glyph_digits",
    } <= set(available_datasets())


def _batch(path, n, seed, key=b"labels", n_classes=10):
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
    labels = list(rng.integers(0, n_classes, n))
    with open(path, "wb") as f:
        pickle.dump({b"data": data, key: labels, b"batch_label": b"x"}, f)
    return data, labels


def test_cifar10_python_batches(tmp_path):
    folder = tmp_path / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    parts = [_batch(folder / f"data_batch_{k}", 3, k) for k in range(1, 6)]
    td, tl = _batch(folder / "test_batch", 4, 9)
    full = get_dataset("cifar10", tmp_path, "train_full")
    assert full.images.shape == (15, 3, 32, 32) and full.images.dtype == torch.uint8
    # rows of 3072 bytes are the R, G and B planes of a 32x32 image, batches in order
    assert np.array_equal(full.images[3].numpy(), parts[1][0][0].reshape(3, 32, 32))
    assert full.labels.tolist() == sum((p[1] for p in parts), [])
    te = get_dataset("cifar10", tmp_path, "test")
    assert len(te) == 4 and te.labels.tolist() == tl and te.classes[0] == "airplane"


def test_cifar100_python_batches(tmp_path):
    folder = tmp_path / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    d, l = _batch(folder / "train", 7, 1, key=b"fine_labels", n_classes=100)
    _batch(folder / "test", 5, 2, key=b"fine_labels", n_classes=100)
    full = get_dataset("cifar100", tmp_path, "train_full")
    assert len(full) == 7 and full.labels.tolist() == l and len(full.classes) == 100
    assert len(get_dataset("cifar100", tmp_path, "test")) == 5


def test_fashion_mnist_idx_layout(tmp_path):
    raw = tmp_path / "fashion_mnist" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)

    def idx(path, arr):
        with gzip.open(path, "wb") as f:
            f.write(struct.pack(">HBB", 0, 8, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes())

    x = np.random.default_rng(0).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    idx(raw / "t10k-images-idx3-ubyte.gz", x)
    idx(raw / "t10k-labels-idx1-ubyte.gz", np.arange(6, dtype=np.uint8))
    te = get_dataset("fashion_mnist", tmp_path, "test")
    assert np.array_equal(te.images[:, 0].numpy(), x) and te.classes[9] == "Ankle boot"


@pytest.mark.parametrize(
    "name,script",
    [
        ("smallnorb", "smallnorb.py"),
        ("affnist", "affnist.py"),
        ("cifar100", "cifar100.py"),
        ("fashion_mnist", "fashion_mnist.py"),
    ],
)
def test_missing_data_errors_name_dataset_command_and_offline_option(tmp_path, monkeypatch, name, script):
    with pytest.raises(DatasetUnavailableError) as e:  # standin=False: smallnorb has a generated stand-in
        get_dataset(name, tmp_path, "test", standin=False, offline=True)
    msg = str(e.value)
    assert name in msg and f"python data_scripts/{script} --root {tmp_path}" in msg and "CAPSULE_OFFLINE=1" in msg


TREES = [
    "(3 (2 It) (4 (2 's) (3 (2 a) (4 fine))))",
    "(1 (2 Not) (1 (2 good)))",
    "(2 (2 Just) (2 (2 a) (2 film)))",
    "(0 (0 Awful) (2 .))",
]


def test_sst_trees(tmp_path):
    folder = tmp_path / "sst" / "trees"
    folder.mkdir(parents=True)
    for f in ("train.txt", "dev.txt", "test.txt"):
        (folder / f).write_text("\n".join(TREES) + "\n")
    texts, labels = load_sst(tmp_path, "train")
    assert texts == ["It 's a fine", "Not good", "Just a film", "Awful ."] and labels == [3, 1, 2, 0]
    t2, l2 = load_sst(tmp_path, "test", classes=2)
    assert t2 == ["It 's a fine", "Not good", "Awful ."] and l2 == [1, 0, 0]  # neutral dropped
    ts, ls = load_sst(tmp_path, "val", subtrees=True)
    assert len(ts) == len(set(ts)) and ("fine", 4) in zip(ts, ls) and ("a", 2) in zip(ts, ls)
    assert parse_tree(TREES[1])[0] == ("Not good", 1)
    with pytest.raises(ValueError, match="unbalanced"):
        parse_tree("(3 (2 It) (4 fine)")
    with pytest.raises(ValueError, match="bad label"):
        parse_tree("(7 (2 It))")
    with pytest.raises(DatasetUnavailableError, match="python data_scripts/sst.py"):
        load_sst(tmp_path / "none", "train")
