import json

import pytest
import torch

from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.pretrained import (
    ChecksumMismatchError,
    export_checkpoint,
    load_pretrained,
    load_pretrained_history,
    registry,
    sha256_file,
)
from capsule_lib.train import History

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(16, 32))


def test_export_load_roundtrip(tmp_path):
    model = CapsNet(TINY).eval()
    hist = History([{"epoch": 1, "val_acc": 0.5}], {"seed": 0})
    entry = export_checkpoint(
        model,
        "tiny",
        "capsnet",
        TINY,
        metrics={"test_acc": 0.1},
        training={"epochs": 1},
        history=hist,
        directory=tmp_path,
    )
    assert entry["sha256"] == sha256_file(tmp_path / "tiny.pt")
    loaded, e = load_pretrained("tiny", directory=tmp_path)
    assert e["metrics"]["test_acc"] == 0.1 and not loaded.training
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        a, b = model(x).scores, loaded(x).scores
    assert torch.allclose(a, b, atol=2e-3)  # weights stored in fp16
    assert load_pretrained_history("tiny", directory=tmp_path).records == hist.records


def test_hash_mismatch_is_refused(tmp_path):
    export_checkpoint(CapsNet(TINY), "tiny", "capsnet", TINY, metrics={}, training={}, directory=tmp_path)
    p = tmp_path / "tiny.pt"
    data = bytearray(p.read_bytes())
    data[-10] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ChecksumMismatchError, match="sha256 mismatch"):
        load_pretrained("tiny", directory=tmp_path)


def test_unknown_name(tmp_path):
    with pytest.raises(KeyError, match="no shipped checkpoint"):
        load_pretrained("nope", directory=tmp_path)


def test_shipped_registry_files_match_their_hashes():
    reg = registry()
    for name, entry in reg.items():
        from capsule_lib.pretrained import CHECKPOINT_DIR

        assert sha256_file(CHECKPOINT_DIR / entry["file"]) == entry["sha256"], name
        assert (CHECKPOINT_DIR / entry["file"]).stat().st_size < 20_000_000, name
        json.dumps(entry)


def test_export_run_at_an_epoch_budget(tmp_path):
    from capsule_lib.models.baselines import BaselineCNNConfig
    from capsule_lib.pretrained import export_run
    from capsule_lib.train import train

    run = tmp_path / "run"
    train(
        "baseline_cnn",
        epochs=2,
        dataset="glyph_digits",
        train_subset=64,
        eval_subset=64,
        device="cpu",
        model=BaselineCNNConfig(channels=(4, 4, 4)),
        out_dir=run,
        progress=False,
        test=False,
    )
    assert (run / "epoch_001.pt").exists() and (run / "epoch_002.pt").exists()
    entry = export_run(run, "cnn1", max_epoch=1, directory=tmp_path / "ck")
    assert entry["metrics"]["selected_epoch"] == 1 and entry["training"]["epochs"] == 1
    model, e = load_pretrained("cnn1", directory=tmp_path / "ck")
    assert e["sha256"] == sha256_file(tmp_path / "ck" / "cnn1.pt")
    assert 0.0 <= e["metrics"]["test_acc"] <= 1.0 and e["metrics"]["test_size"] == 2000


def test_shipped_histories_record_recipe_changes_where_the_lr_shows_them():
    """A resumed run with a new per-epoch decay records ``from_epoch``: the records' lr must follow the old
    decay before it and the new decay from it on (lr = lr0 * decay ** (epoch - 1))."""
    from capsule_lib.pretrained import load_pretrained_history, registry

    checked = 0
    for name in registry():
        h = load_pretrained_history(name)
        cfg = h.meta.get("config") or {}
        for change in h.meta.get("changes", []):
            new = change["config"]
            if "lr_decay" not in new or new.get("lr_decay_steps") or cfg.get("lr_decay_steps"):
                continue  # only per-epoch exponential schedules can be checked this way
            for rec in h.records:
                decay = new["lr_decay"] if rec["epoch"] >= change["from_epoch"] else cfg["lr_decay"]
                want = max(cfg["lr"] * decay ** (rec["epoch"] - 1), cfg.get("lr_min", 0.0))
                assert rec["lr"] == pytest.approx(want, rel=1e-4), (name, rec["epoch"], change["from_epoch"])
            checked += 1
    assert checked >= 1


@pytest.mark.slow
@pytest.mark.realdata
@pytest.mark.parametrize("name", ["capsnet_mnist_gpu", "efficient_capsnet_mnist_gpu"])
def test_gpu_trained_checkpoints_reevaluate_to_their_registry_figures(name, real_data):
    """The checkpoints trained on an H200 (#36), evaluated here on the real MNIST test set, make exactly the number of
    errors their registry entries record (99.62 % and 99.54 %), and their entries keep the GPU run's history."""
    from capsule_lib.data import get_dataset
    from capsule_lib.evaluation import predict

    model, entry = load_pretrained(name)
    test = get_dataset("mnist", real_data, "test", standin=False)
    errors = int((predict(model, test.images, batch_size=500)["scores"].argmax(1) != test.labels).sum())
    assert errors == entry["metrics"]["test_errors"] and len(test) == entry["metrics"]["test_size"] == 10_000
    assert entry["training"]["hardware"] == "NVIDIA H200"
    history = load_pretrained_history(name)
    assert history.meta["test"]["test_acc"] == pytest.approx(entry["metrics"]["test_acc"], abs=1e-6)
    assert history.best("val_acc")["epoch"] == entry["metrics"]["selected_epoch"]
