"""affNIST: the official .mat structure (written here with scipy.io.savemat), the zip, the loader and the
40x40 placement helpers."""

import zipfile

import numpy as np
import pytest
import scipy.io
import torch

from capsule_lib.data import DatasetUnavailableError, get_dataset
from capsule_lib.data.affnist import AffNISTFormatError, center_pad, random_place, read_affnist_mat


def fake_affnist(path, n=12, seed=0, with_transform=True):
    """A .mat file shaped like the official one: struct ``affNISTdata`` with one column per image."""
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, (n, 40, 40), dtype=np.uint8)
    labels = (np.arange(n) % 10).astype(np.uint8)
    rec = {
        "image": imgs.reshape(n, 1600).T.copy(),  # [1600, N]: each column one row-major 40x40 image
        "label_int": labels[None, :],
        "label_one_of_n": np.eye(10, dtype=np.uint8)[labels].T.copy(),
    }
    if with_transform:
        rec["human_readable_transform"] = rng.normal(size=(7, n))
    scipy.io.savemat(path, {"affNISTdata": rec})
    return imgs, labels, rec


def test_reads_the_official_structure(tmp_path):
    imgs, labels, rec = fake_affnist(tmp_path / "affNIST_test.mat")
    a = read_affnist_mat(tmp_path / "affNIST_test.mat")
    assert a["images"].shape == (12, 40, 40) and a["images"].dtype == np.uint8
    assert np.array_equal(a["images"], imgs) and np.array_equal(a["labels"], labels)
    # column k of `image` is image k read row-major
    assert np.array_equal(a["images"][5].reshape(-1), rec["image"][:, 5])
    assert np.allclose(a["transform"], rec["human_readable_transform"].T)


def test_loader_from_mat_and_from_zip(tmp_path):
    folder = tmp_path / "affnist"
    folder.mkdir()
    imgs, labels, _ = fake_affnist(folder / "test.mat", with_transform=False)
    ds = get_dataset("affnist", tmp_path, "test")
    assert ds.images.shape == (12, 1, 40, 40) and torch.equal(ds.labels, torch.from_numpy(labels.astype(np.int64)))
    assert not ds.generated and "transform" not in ds.extra
    (folder / "test.mat").rename(tmp_path / "test.mat")
    with zipfile.ZipFile(folder / "test.mat.zip", "w") as z:  # the official download: test.mat inside a zip
        z.write(tmp_path / "test.mat", "test.mat")
    ds2 = get_dataset("affnist", tmp_path, "test")
    assert torch.equal(ds2.images[:, 0], torch.from_numpy(imgs))


def test_bad_files_and_splits(tmp_path):
    folder = tmp_path / "affnist"
    folder.mkdir()
    scipy.io.savemat(folder / "affNIST_test.mat", {"somethingelse": np.zeros(3)})
    with pytest.raises(AffNISTFormatError, match="no 'affNISTdata' struct"):
        get_dataset("affnist", tmp_path, "test")
    scipy.io.savemat(
        folder / "affNIST_test.mat",
        {"affNISTdata": {"image": np.zeros((784, 3), np.uint8), "label_int": np.zeros((1, 3), np.uint8)}},
    )
    with pytest.raises(AffNISTFormatError, match=r"\[1600, N\]"):
        get_dataset("affnist", tmp_path, "test")
    (folder / "affNIST_test.mat").write_bytes(b"MATLAB 5.0 garbage" + bytes(100))
    with pytest.raises(AffNISTFormatError, match="not a readable MATLAB file"):
        get_dataset("affnist", tmp_path, "test")
    with pytest.raises(ValueError, match="only the official test set"):
        get_dataset("affnist", tmp_path, "train")


def test_missing_affnist_message(tmp_path, monkeypatch):
    with pytest.raises(DatasetUnavailableError) as e:
        get_dataset("affnist", tmp_path, "test", offline=True)
    msg = str(e.value)
    assert (
        "affnist" in msg and f"python data_scripts/affnist.py --root {tmp_path}" in msg and "CAPSULE_OFFLINE=1" in msg
    )


def test_center_pad_and_random_place():
    x = torch.randint(1, 256, (64, 1, 28, 28), dtype=torch.uint8)
    c = center_pad(x, 40)
    assert c.shape == (64, 1, 40, 40) and torch.equal(c[:, :, 6:34, 6:34], x) and c.sum() == x.sum()
    g = torch.Generator().manual_seed(0)
    p = random_place(x, 40, g)
    assert p.shape == (64, 1, 40, 40)
    assert torch.equal(p.flatten(1).long().sum(1), x.flatten(1).long().sum(1))  # nothing cut off
    tops = set()
    for b in range(64):  # each is the digit at some offset in 0..12
        nz = (p[b, 0] > 0).nonzero()
        top, left = nz[:, 0].min().item(), nz[:, 1].min().item()
        assert torch.equal(p[b, 0, top : top + 28, left : left + 28], x[b, 0])
        tops.add(top)
    assert min(tops) >= 0 and max(tops) <= 12 and len(tops) > 5
    assert torch.equal(random_place(x, 40, torch.Generator().manual_seed(0)), p)
    with pytest.raises(ValueError, match="do not fit"):
        center_pad(x, 20)
