"""Data, checkpoint and training paths that must fail loudly (one actionable line naming the file) or keep the
right weights, instead of silently producing wrong results."""
import gzip
import json

import numpy as np
import pytest
import torch

from capsule_lib.data import get_dataset, read_idx
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.pretrained import export_checkpoint, registry
from capsule_lib.training import CapsuleObjective, TensorLoader, Trainer

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


def _idx(images: np.ndarray) -> bytes:
    dims = images.shape
    return bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + images.tobytes()


def _write_mnist(raw, n_img: int, n_lab: int, truncate: bool = False):
    raw.mkdir(parents=True)
    for stem, arr in [("t10k-images-idx3-ubyte", np.zeros((n_img, 28, 28), np.uint8)),
                      ("t10k-labels-idx1-ubyte", np.zeros((n_lab,), np.uint8))]:
        data = gzip.compress(_idx(arr))
        (raw / f"{stem}.gz").write_bytes(data[: len(data) // 2] if truncate and "images" in stem else data)


def test_truncated_gzip_names_the_file_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    _write_mnist(raw, 10, 10, truncate=True)
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte\.gz: corrupt or truncated file .*data_scripts/mnist\.py"):
        read_idx(raw / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        get_dataset("mnist", tmp_path, "test", standin=False)


def test_images_and_labels_of_different_lengths_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CAPSULE_OFFLINE", "1")
    _write_mnist(tmp_path / "mnist" / "MNIST" / "raw", 10, 9)
    with pytest.raises(ValueError, match=r"has 10 images but .*t10k-labels-idx1-ubyte\.gz has 9 labels"):
        get_dataset("mnist", tmp_path, "test")


def test_truncated_registry_names_the_file(tmp_path):
    (tmp_path / "registry.json").write_text('{"capsnet_mnist": {"file": "x.pt", ')
    with pytest.raises(ValueError, match=r"registry\.json: the checkpoint registry is not valid JSON"):
        registry(tmp_path)


def test_export_is_atomic(tmp_path, monkeypatch):
    model = CapsNet(TINY)
    export_checkpoint(model, "m", "capsnet", TINY, metrics={"val_acc": 0.5}, training={}, directory=tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def crash(obj, f, *a, **k):  # the process dies half-way through writing the weights
        with open(f, "wb") as fh:
            fh.write(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        export_checkpoint(model, "m", "capsnet", TINY, metrics={"val_acc": 0.9}, training={}, directory=tmp_path)
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if not p.name.endswith(".tmp")}
    assert after == before, "a crash during export changed the shipped checkpoint or the registry"
    assert registry(tmp_path)["m"]["metrics"]["val_acc"] == 0.5


def _trainer(out_dir):
    torch.manual_seed(0)
    model = CapsNet(TINY)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    return Trainer(model, CapsuleObjective(), opt, device="cpu", out_dir=out_dir, seed=0, progress=False)


@pytest.fixture(scope="module")
def glyphs():
    return get_dataset("glyph_digits", split="train", n=256), get_dataset("glyph_digits", split="val", n=256)


def test_truncated_last_checkpoint_gives_one_actionable_line(tmp_path, glyphs):
    tr, va = glyphs
    t = _trainer(tmp_path)
    t.fit(TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 128), epochs=1)
    last = tmp_path / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])
    with pytest.raises(RuntimeError, match=r"last\.pt: cannot read this checkpoint .*truncated or corrupt\. Delete it"):
        _trainer(tmp_path).resume()


def test_without_out_dir_load_best_restores_the_best_epoch(glyphs):
    """Epoch 2 is made worse on purpose (weights zeroed, lr 0; the validation set has no digit 0, which a
    zeroed CapsNet predicts): load_best must bring back epoch 1's weights, not keep the last ones."""
    tr, va = glyphs
    va = va.subset(torch.nonzero(va.labels != 0).flatten())
    snapshots = {}

    def sabotage(trainer, rec):
        snapshots[rec["epoch"]] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if rec["epoch"] == 1:
            with torch.no_grad():
                for p in trainer.model.parameters():
                    p.zero_()
            for g in trainer.optimizer.param_groups:
                g["lr"] = 0.0

    t = _trainer(None)
    t.callbacks = (sabotage,)
    hist = t.fit(TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 128), epochs=2)
    assert hist.records[0]["val_acc"] > hist.records[1]["val_acc"] == 0.0
    rec = t.load_best()
    assert rec is not None and rec["epoch"] == 1
    for k, v in t.model.state_dict().items():
        assert torch.equal(v, snapshots[1][k]), k
