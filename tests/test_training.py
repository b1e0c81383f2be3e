import json

import pytest
import torch

from capsule_lib.data import TensorLoader, get_dataset
from capsule_lib.data.transforms import random_shift
from capsule_lib.losses import CapsuleObjective, ClassifierObjective
from capsule_lib.models.baselines import BaselineCNN
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.train import History, Trainer, load_history, select_device

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


@pytest.fixture(scope="module")
def glyphs():
    tr = get_dataset("glyph_digits", split="train", n=256)
    va = get_dataset("glyph_digits", split="val", n=128)
    return tr, va


def make_trainer(out_dir, seed=0):
    torch.manual_seed(seed)
    model = CapsNet(TINY)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.95**s)
    return Trainer(
        model,
        CapsuleObjective(),
        opt,
        sched,
        scheduler_step="batch",
        device="cpu",
        out_dir=out_dir,
        seed=seed,
        progress=False,
    )


def loaders(glyphs, seed=0):
    tr, va = glyphs

    def aug(batch, g):
        return (random_shift(batch[0], 2, g), *batch[1:])

    return (
        TensorLoader.from_dataset(tr, 64, shuffle=True, seed=seed, transform=aug),
        TensorLoader.from_dataset(va, 128),
    )


def test_loader_is_reproducible_per_epoch(glyphs):
    a, _ = loaders(glyphs)
    b, _ = loaders(glyphs)
    a.set_epoch(3)
    b.set_epoch(3)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    b.set_epoch(4)
    assert not torch.equal(next(iter(a))[1], next(iter(b))[1])
    assert len(a) == 4
    x, _ = next(iter(a))
    assert x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1


def test_loader_rejects_mismatched_tensors():
    with pytest.raises(ValueError, match="first dimension"):
        TensorLoader([torch.zeros(3, 1), torch.zeros(4)])


def test_random_shift_moves_content_with_zero_fill():
    x = torch.zeros(1, 1, 6, 6)
    x[0, 0, 2, 2] = 1.0
    g = torch.Generator().manual_seed(0)
    for _ in range(10):
        y = random_shift(x, 2, g)
        assert y.sum() == 1.0  # content moved, not duplicated (the pixel never leaves the frame here)
        (r, c) = (y[0, 0] == 1).nonzero()[0].tolist()
        assert abs(r - 2) <= 2 and abs(c - 2) <= 2


def test_fit_writes_history_and_checkpoints(tmp_path, glyphs):
    tl, vl = loaders(glyphs)
    trainer = make_trainer(tmp_path)
    hist = trainer.fit(tl, vl, epochs=2)
    assert len(hist) == 2
    rec = hist.records[-1]
    for key in (
        "train_loss",
        "train_acc",
        "train_margin",
        "train_recon",
        "val_loss",
        "val_acc",
        "lr",
        "epoch_time",
        "wall_time",
    ):
        assert key in rec, key
    assert (tmp_path / "last.pt").exists() and (tmp_path / "best.pt").exists()
    saved = load_history(tmp_path / "history.json")
    assert saved.records == json.loads(json.dumps(hist.records))
    assert hist.meta["seed"] == 0 and hist.meta["device"] == "cpu"
    assert hist.records[1]["lr"] < hist.records[0]["lr"]  # the schedule was stepped


def test_resume_is_equivalent_to_uninterrupted(tmp_path, glyphs):
    tl, vl = loaders(glyphs)
    straight = make_trainer(tmp_path / "a")
    straight.fit(tl, vl, epochs=2)

    first = make_trainer(tmp_path / "b")
    first.fit(tl, vl, epochs=1)
    resumed = make_trainer(tmp_path / "b", seed=0)
    # a fresh model with different initial weights: everything must come from last.pt
    torch.manual_seed(99)
    for p in resumed.model.parameters():
        torch.nn.init.normal_(p)
    resumed.fit(tl, vl, epochs=2)
    assert resumed.epoch == 2 and len(resumed.history) == 2
    for (n, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.allclose(p, q, atol=1e-6), n
    assert straight.history.records[1]["train_loss"] == pytest.approx(resumed.history.records[1]["train_loss"])


def test_model_selection_uses_validation_not_test(tmp_path, glyphs):
    tl, vl = loaders(glyphs)
    _, va = glyphs
    trainer = make_trainer(tmp_path)
    # a "test" loader with permuted labels: its accuracy must not influence best.pt
    bad = TensorLoader([va.images, va.labels[torch.randperm(len(va))]], 128)
    hist = trainer.fit(tl, vl, epochs=2, test_loader=bad)
    best = hist.best("val_acc")
    assert "test_acc" in hist.records[0]
    ck = torch.load(tmp_path / "best.pt", weights_only=False)
    assert ck["epoch"] == best["epoch"]


def test_classifier_objective_and_learning(glyphs):
    tr, va = glyphs
    torch.manual_seed(0)
    model = BaselineCNN(channels=(8, 8, 8), hidden=(32, 16), dropout=0.0)
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    trainer = Trainer(model, ClassifierObjective(), opt, device="cpu", progress=False)
    before = trainer.evaluate(TensorLoader.from_dataset(va, 128))["val_acc"]
    trainer.fit(TensorLoader.from_dataset(tr, 32, shuffle=True), None, epochs=3)
    after = trainer.evaluate(TensorLoader.from_dataset(va, 128))["val_acc"]
    assert after > before + 0.2


def test_history_roundtrip_and_best():
    h = History([{"epoch": 1, "val_acc": 0.5}, {"epoch": 2, "val_acc": 0.7}, {"epoch": 3, "val_acc": 0.6}], {"x": 1})
    assert h.best()["epoch"] == 2
    assert History.from_dict(h.to_dict()).records == h.records
    assert h.column("epoch") == [1, 2, 3]


def test_select_device_and_bad_arguments():
    assert select_device("cpu").type == "cpu"
    assert select_device("auto").type in ("cpu", "cuda", "mps")
    m = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(m.parameters(), 0.1)
    with pytest.raises(ValueError):
        Trainer(m, ClassifierObjective(), opt, amp="int8")
    with pytest.raises(ValueError):
        Trainer(m, ClassifierObjective(), opt, scheduler_step="week")


def test_bf16_autocast_training_step_is_finite(glyphs):
    tl, _ = loaders(glyphs)
    trainer = make_trainer(None)
    trainer.amp = "bf16"
    rec = trainer.train_epoch(tl)
    assert torch.isfinite(torch.tensor(rec["train_loss"]))


def test_multidigit_objective_and_multimnist_loader():
    from capsule_lib.data.multimnist import MultiMNISTLoader
    from capsule_lib.losses import MultiDigitObjective
    from capsule_lib.models.efficient import EfficientCapsNet, EfficientCapsNetConfig

    src = get_dataset("glyph_digits", split="train", n=200)
    loader = MultiMNISTLoader(src, 64, 32, "efficient", seed=0)
    loader.set_epoch(0)
    x, y2, a, b = next(iter(loader))
    assert x.shape == (32, 1, 36, 36) and y2.shape == (32, 2) and a.shape == b.shape == x.shape
    assert torch.all(y2[:, 0] != y2[:, 1])  # partners of different classes
    assert torch.allclose(x, (a + b).clamp(max=1.0), atol=1 / 255 + 1e-6)
    loader.set_epoch(1)
    x1 = next(iter(loader))[0]
    assert not torch.equal(x, x1)  # fresh pairs every epoch
    fixed = MultiMNISTLoader(src, 64, 32, "efficient", fresh=False, shuffle=False)
    fixed.set_epoch(0)
    f0 = next(iter(fixed))[0]
    fixed.set_epoch(5)
    assert torch.equal(f0, next(iter(fixed))[0])

    torch.manual_seed(0)
    model = EfficientCapsNet(EfficientCapsNetConfig.multimnist())
    out = MultiDigitObjective()(model, (x, y2, a, b), True)
    assert torch.isfinite(out.loss) and set(out.parts) == {"margin", "recon"}
    assert 0 <= out.correct <= 32 and out.n == 32
    out.loss.backward()


def test_time_training_step_leaves_model_unchanged(glyphs):
    from capsule_lib.cost import time_training_step

    tr, _ = glyphs
    model = CapsNet(TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    t = time_training_step(model, CapsuleObjective(), (tr.float_images()[:16], tr.labels[:16]), repeats=1)
    assert t > 0
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_recipes_smoke(tmp_path):
    """Each recipe runs end to end on a few generated images and writes a resumable run directory."""
    from capsule_lib.models.baselines import BaselineCNNConfig
    from capsule_lib.train import train
    from capsule_lib.train.recipes import BaselineCNNRecipe, CapsNetRecipe, EfficientMultiMNISTRecipe

    _, tr = train(
        CapsNetRecipe(epochs=1, dataset="glyph_digits", train_subset=64, eval_subset=64, device="cpu", model=TINY),
        out_dir=tmp_path / "caps",
        progress=False,
        test=False,
    )
    assert (tmp_path / "caps" / "history.json").exists() and tr.history.meta["parameters"] > 0
    _, tr = train(
        BaselineCNNRecipe(
            epochs=1,
            dataset="glyph_digits",
            train_subset=64,
            eval_subset=64,
            device="cpu",
            model=BaselineCNNConfig(channels=(4, 4, 4)),
        ),
        out_dir=tmp_path / "cnn",
        progress=False,
        test=False,
    )
    assert tr.history.records[0]["val_acc"] >= 0
    _, tr = train(
        EfficientMultiMNISTRecipe(epochs=1, pairs_per_epoch=64, val_pairs=32, device="cpu", dataset="glyph_digits"),
        out_dir=tmp_path / "emm",
        progress=False,
        test=False,
    )
    assert "both digits" in tr.history.meta["accuracy"]


def test_resume_with_changed_recipe_is_recorded(tmp_path, glyphs):
    tl, vl = loaders(glyphs)
    first = make_trainer(tmp_path)
    first.history.meta["config"] = {"lr_decay": 0.95}
    first._meta = {"config": {"lr_decay": 0.95}}
    first.fit(tl, vl, epochs=1)
    again = make_trainer(tmp_path)
    again._meta = {"config": {"lr_decay": 0.9}}
    again.fit(tl, vl, epochs=2)
    assert again.history.meta["config"] == {"lr_decay": 0.95}
    assert again.history.meta["changes"] == [{"from_epoch": 2, "config": {"lr_decay": 0.9}}]


def test_resume_applies_a_changed_lambda_schedule_at_once(tmp_path, glyphs):
    tl, vl = loaders(glyphs)
    first = make_trainer(tmp_path)
    first._meta = first.history.meta = {"config": {"decay": 0.95}}
    first.fit(tl, vl, epochs=1)  # 4 batches: lr = 1e-3 * 0.95**4 afterwards
    again = make_trainer(tmp_path)
    again._meta = {"config": {"decay": 0.5}}
    again.scheduler = torch.optim.lr_scheduler.LambdaLR(again.optimizer, lambda s: 0.5**s)
    again.fit(tl, vl, epochs=2)
    assert again.history.records[1]["lr"] == pytest.approx(1e-3 * 0.5**4)


def test_train_starts_from_a_shipped_checkpoint(tmp_path):
    """start_from loads a shipped checkpoint's weights (lr 0 keeps them: the trained model is the shipped one) and
    records which; a checkpoint of another model configuration is refused in one line."""
    from capsule_lib.pretrained import load_pretrained
    from capsule_lib.train import shipped_recipe, train

    shipped, entry = load_pretrained("baseline_cnn_mnist")
    smoke = dict(epochs=1, dataset="glyph_digits", train_subset=32, eval_subset=32, device="cpu", lr=0.0)
    model, tr = train(
        shipped_recipe("baseline_cnn_mnist", **smoke),
        out_dir=tmp_path / "warm",
        progress=False,
        test=False,
        start_from="baseline_cnn_mnist",
    )
    assert tr.history.meta["start_from"] == {
        "checkpoint": "baseline_cnn_mnist",
        "sha256": entry["sha256"],
        "epochs": entry["training"]["epochs"],
    }
    for (k, p), q in zip(shipped.state_dict().items(), model.state_dict().values()):
        torch.testing.assert_close(p, q, msg=k)
    with pytest.raises(ValueError, match=r"^start_from='baseline_cnn_mnist': that checkpoint's model configuration"):
        train(
            shipped_recipe("baseline_cnn_mnist", **smoke, **{"model.channels": [4, 4, 4]}),
            progress=False,
            test=False,
            start_from="baseline_cnn_mnist",
        )
