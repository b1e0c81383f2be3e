"""Data, checkpoint and training paths that must fail loudly (one actionable line naming the file) or keep the
right weights, instead of silently producing wrong results."""

import gzip
import json

import numpy as np
import pytest
import torch

import capsule_lib.routing as R
from capsule_lib.data import TensorLoader, get_dataset, read_idx
from capsule_lib.data.transforms import random_shift
from capsule_lib.losses import CapsuleObjective
from capsule_lib.models.capsnet import CapsNet, CapsNetConfig
from capsule_lib.pretrained import export_checkpoint, registry
from capsule_lib.train import Trainer

TINY = CapsNetConfig(conv_channels=8, primary_types=4, class_dim=8, decoder_hidden=(32, 64))


def _idx(images: np.ndarray) -> bytes:
    dims = images.shape
    return bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + images.tobytes()


def _write_mnist(raw, n_img: int, n_lab: int, truncate: bool = False):
    raw.mkdir(parents=True)
    for stem, arr in [
        ("t10k-images-idx3-ubyte", np.zeros((n_img, 28, 28), np.uint8)),
        ("t10k-labels-idx1-ubyte", np.zeros((n_lab,), np.uint8)),
    ]:
        data = gzip.compress(_idx(arr))
        (raw / f"{stem}.gz").write_bytes(data[: len(data) // 2] if truncate and "images" in stem else data)


def test_truncated_gzip_names_the_file_and_the_fix(tmp_path, monkeypatch):
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    _write_mnist(raw, 10, 10, truncate=True)
    with pytest.raises(
        ValueError, match=r"t10k-images-idx3-ubyte\.gz: corrupt or truncated file .*data_scripts/mnist\.py"
    ):
        read_idx(raw / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        get_dataset("mnist", tmp_path, "test", standin=False, offline=True)


def test_images_and_labels_of_different_lengths_are_refused(tmp_path, monkeypatch):
    _write_mnist(tmp_path / "mnist" / "MNIST" / "raw", 10, 9)
    with pytest.raises(ValueError, match=r"has 10 images but .*t10k-labels-idx1-ubyte\.gz has 9 labels"):
        get_dataset("mnist", tmp_path, "test", offline=True)


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


def _shifted_loaders(glyphs):
    """``(train, val)`` loaders over ``glyphs``: training shuffled (seed 0) with random shifts of up to 2 px, so a
    run built from them twice sees the same batches and augmentations."""
    tr, va = glyphs
    aug = lambda b, g: (random_shift(b[0], 2, g), *b[1:])  # noqa: E731
    return TensorLoader.from_dataset(tr, 64, shuffle=True, seed=0, transform=aug), TensorLoader.from_dataset(va, 128)


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


def test_resume_refuses_a_different_run_in_one_line(tmp_path, glyphs):
    """A full run must not silently continue a smoke run that used the same folder."""
    from capsule_lib.train import RunMismatchError

    tr, va = glyphs
    tl, vl = TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 128)
    smoke = _trainer(tmp_path)
    smoke._meta = {"recipe": "capsnet", "dataset": "mnist", "train_images": 512, "config": {"model": {"a": 1}}}
    smoke.fit(tl, vl, epochs=1)
    full = _trainer(tmp_path)
    full._meta = {**smoke._meta, "train_images": 55000}
    with pytest.raises(RunMismatchError, match=r"last\.pt belongs to a different run \(train_images: 512 -> 55000\)"):
        full.fit(tl, vl, epochs=2)
    fresh = _trainer(tmp_path)
    fresh._meta = full._meta
    hist = fresh.fit(tl, vl, epochs=1, resume=False)  # explicit: start afresh
    assert len(hist) == 1 and fresh.epoch == 1
    same = _trainer(tmp_path)
    same._meta = full._meta
    same.fit(tl, vl, epochs=2)  # the same run resumes
    assert same.epoch == 2 and len(same.history) == 2


def test_recipes_read_the_test_split_once_after_selection(tmp_path, monkeypatch):
    from capsule_lib.train import Trainer as T
    from capsule_lib.train import recipes, train

    calls = []
    real = T.evaluate

    def spy(self, loader, prefix="val"):
        calls.append((prefix, self.epoch))
        return real(self, loader, prefix)

    monkeypatch.setattr(T, "evaluate", spy)
    r = recipes.CapsNetRecipe(epochs=2, train_subset=128, eval_subset=64, model=TINY, device="cpu")
    _, trainer = train(r, out_dir=tmp_path, data_root=str(tmp_path), offline=True, progress=False)
    assert [c for c in calls if c[0] == "test"] == [("test", 2)]  # once, after the last epoch
    assert all("test_acc" not in rec for rec in trainer.history.records)
    test = trainer.history.meta["test"]
    assert test["epoch"] == trainer.history.best("val_acc")["epoch"] and 0 <= test["test_acc"] <= 1
    assert json.loads((tmp_path / "history.json").read_text())["meta"]["test"] == test


def test_predict_refuses_images_outside_the_models_input_range():
    """0-255 floats or mean/std-normalised images silently wreck a [0, 1] model's accuracy: refuse them."""
    from capsule_lib.evaluation import predict

    m = CapsNet(TINY).eval()
    x = torch.randint(0, 256, (4, 1, 28, 28), dtype=torch.uint8)
    ok = predict(m, x)["scores"]  # uint8 is converted
    assert torch.allclose(ok, predict(m, x.float() / 255)["scores"])
    with pytest.raises(
        ValueError, match=r"predict\(CapsNet\): images: float images must be in \[0, 1\], got values in \[0, 255\]"
    ):
        predict(m, x.float())
    with pytest.raises(ValueError, match="normalised input"):
        predict(m, (x.float() / 255 - 0.1307) / 0.3081)


def test_models_name_a_dtype_or_device_mismatch_in_one_line():
    from capsule_lib.models import EfficientCapsNet, EfficientCapsNetConfig

    for m in (CapsNet(TINY), EfficientCapsNet(EfficientCapsNetConfig.mnist())):
        name = type(m).__name__
        with pytest.raises(
            ValueError, match=rf"^{name}: the input is torch.float16 but the parameters are torch.float32; "
        ):
            m(torch.rand(2, 1, 28, 28).half())
        with pytest.raises(ValueError, match=rf"^{name}: the input is on meta but the parameters are on cpu; "):
            m(torch.rand(2, 1, 28, 28, device="meta"))
        with torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast, mixed dtypes are the point
            m(torch.rand(2, 1, 28, 28).bfloat16())


def test_routing_layers_name_a_device_mismatch():
    from capsule_lib.routing.dynamic import DynamicRouting

    layer = DynamicRouting(8, 4, 3, 5)
    with pytest.raises(ValueError, match=r"^DynamicRouting: the input is on meta but the parameters are on cpu"):
        layer(torch.rand(2, 8, 3, device="meta"))


def test_mid_epoch_checkpoint_resumes_exactly(tmp_path, glyphs):
    """Interrupted inside epoch 2 (after a mid-epoch checkpoint), the resumed run ends with the same weights
    and the same epoch records as the uninterrupted one: same batches, augmentations and random states."""

    def trainer(out_dir, objective=None):
        t = _trainer(out_dir)
        t.checkpoint_minutes = 0.0  # a mid-epoch checkpoint after every batch
        if objective is not None:
            t.objective = objective
        return t

    straight = trainer(tmp_path / "a")
    straight.fit(*_shifted_loaders(glyphs), epochs=2)

    calls = {"n": 0}
    base = CapsuleObjective()

    def dies_in_epoch_2(model, batch, train):
        if train:
            calls["n"] += 1
            if calls["n"] == 7:  # 4 batches per epoch: the 3rd batch of epoch 2
                raise KeyboardInterrupt
        return base(model, batch, train)

    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path / "b", dies_in_epoch_2).fit(*_shifted_loaders(glyphs), epochs=2)
    saved = torch.load(tmp_path / "b" / "last.pt", weights_only=False)
    assert saved["epoch"] == 1 and saved["in_epoch"]["loader"]["batch"] == 2
    resumed = trainer(tmp_path / "b")
    torch.manual_seed(123)
    for p in resumed.model.parameters():  # everything must come from last.pt
        torch.nn.init.normal_(p)
    resumed.fit(*_shifted_loaders(glyphs), epochs=2)
    for (k, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=k)
    for a, b in zip(straight.history.records, resumed.history.records):
        for key in ("train_loss", "train_acc", "val_acc", "lr"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key


ROUTINGS = {  # name -> (layer, input maker); the inputs are near zero, where LayerNorm-based routings have
    # their largest gradients
    "dynamic": (lambda: R.DynamicRouting(32, 10, 8, 16), lambda: (1e-3 * torch.randn(16, 32, 8),)),
    "self_attention": (lambda: R.SelfAttentionRouting(16, 10, 8, 16), lambda: (1e-3 * torch.randn(16, 16, 8),)),
    "em": (lambda: R.EMRouting(32, 10, 4), lambda: (1e-3 * torch.randn(16, 32, 16), torch.rand(16, 32))),
    "heinsen2019": (
        lambda: R.GenerativeMatrixRouting(4, 4, 4, n_inp=32, n_out=10),
        lambda: (torch.randn(16, 32), 1e-3 * torch.randn(16, 32, 4, 4)),
    ),
    "heinsen2022": (lambda: R.EfficientVectorRouting(32, 10, 8, 16), lambda: (1e-3 * torch.randn(16, 32, 8),)),
    "inverted": (lambda: R.InvertedFCCapsules(32, 10, 16), lambda: (1e-3 * torch.randn(16, 32, 16),)),
}


@pytest.mark.parametrize("name", sorted(ROUTINGS))
def test_every_routing_returns_the_autocast_dtype(name):
    build, inputs = ROUTINGS[name]
    torch.manual_seed(0)
    layer = build()
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            out = layer(*inputs())
        outs = out if isinstance(out, tuple) else (out,)
        assert [o.dtype for o in outs] == [dtype] * len(outs), name
    out = layer(*inputs())  # outside autocast: fp32 in, fp32 out
    assert all(o.dtype == torch.float32 for o in (out if isinstance(out, tuple) else (out,)))


@pytest.mark.parametrize("name", ["inverted", "heinsen2022"])
def test_layernorm_routings_train_stably_under_bf16_from_near_zero_inputs(name):
    """Inverted attention and Heinsen 2022 normalise near-zero vectors (large gradients there): 60 Adam steps
    under bf16 autocast on near-zero inputs stay finite and lower the loss."""
    build, inputs = ROUTINGS[name]
    torch.manual_seed(0)
    layer = build()
    head = torch.nn.Linear(16, 1)
    (x,) = inputs()
    x = x.requires_grad_()
    y = torch.randint(0, 10, (x.shape[0],))
    opt = torch.optim.Adam([*layer.parameters(), *head.parameters(), x], lr=1e-3)
    losses = []
    for _ in range(60):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = head(layer(x)).squeeze(-1)  # [16, 10]
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad for p in (*layer.parameters(), *head.parameters(), x) if p.grad is not None]
        assert all(torch.isfinite(g).all() for g in grads), name
        opt.step()
        losses.append(loss.item())
    assert all(np.isfinite(losses)) and losses[-1] < 0.8 * losses[0], (name, losses[0], losses[-1])


def _fake_clock_objective(monkeypatch):
    """The Trainer's clock made to advance 10 s per training batch (and not otherwise): the objective to train with."""
    import capsule_lib.train.trainer as training

    clock = {"t": 1_000_000.0}
    monkeypatch.setattr(training.time, "time", lambda: clock["t"])
    base = CapsuleObjective()

    def ten_seconds_a_batch(model, batch, train):
        if train:
            clock["t"] += 10.0
        return base(model, batch, train)

    return ten_seconds_a_batch


def test_budget_stops_inside_an_epoch_and_a_larger_budget_goes_on_exactly(tmp_path, glyphs, monkeypatch):
    """fit(budget_minutes=) stops inside epoch 2 (a fake clock: 10 s per training batch, budget 60 s = 6 of the
    8 batches), records the weights reached as a validated partial epoch 1.5; the same budget again changes
    nothing; a later fit without budget trains on exactly as the uninterrupted run (same weights, same epoch
    records), its history keeping the partial record; best.pt always names a record of the history."""
    straight = _trainer(tmp_path / "a")
    straight.fit(*_shifted_loaders(glyphs), epochs=2)

    ten_seconds_a_batch = _fake_clock_objective(monkeypatch)

    def budgeted(minutes):
        t = _trainer(tmp_path / "b")
        t.objective = ten_seconds_a_batch
        return t, t.fit(*_shifted_loaders(glyphs), epochs=2, budget_minutes=minutes)

    t, hist = budgeted(1.0)
    assert [r["epoch"] for r in hist.records] == [1, 1.5]
    partial = hist.records[-1]
    assert partial["partial"] is True and "val_acc" in partial and partial["wall_time"] == pytest.approx(60.0)
    assert t.epoch == 1 and hist.meta["budget_minutes"] == 1.0
    on_disk = json.loads((tmp_path / "b" / "history.json").read_text())
    assert [r["epoch"] for r in on_disk["records"]] == [1, 1.5]
    saved = torch.load(tmp_path / "b" / "last.pt", weights_only=False)
    assert saved["epoch"] == 1 and saved["in_epoch"]["loader"]["batch"] == 2
    assert [r["epoch"] for r in saved["history"]["records"]] == [1, 1.5]
    assert saved["best_metric"] == max(r["val_acc"] for r in hist.records)

    _, again = budgeted(1.0)  # the budget is spent: nothing changes
    assert [r["epoch"] for r in again.records] == [1, 1.5]
    assert torch.load(tmp_path / "b" / "last.pt", weights_only=False)["in_epoch"]["loader"]["batch"] == 2

    with pytest.raises(ValueError, match=r"^budget_minutes must be > 0"):
        _trainer(tmp_path / "c").fit(*_shifted_loaders(glyphs), epochs=1, budget_minutes=0)

    resumed = _trainer(tmp_path / "b")
    resumed.fit(*_shifted_loaders(glyphs), epochs=2)
    assert [r["epoch"] for r in resumed.history.records] == [1, 1.5, 2]
    assert resumed.history.meta["budget_minutes"] is None  # the latest call had no budget
    for (k, p), q in zip(straight.model.state_dict().items(), resumed.model.state_dict().values()):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5, msg=k)
    full = [r for r in resumed.history.records if not r.get("partial")]
    for a, b in zip(straight.history.records, full):
        for key in ("train_loss", "train_acc", "val_acc"):
            assert a[key] == pytest.approx(b[key], rel=1e-6), key
    best = torch.load(tmp_path / "b" / "best.pt", weights_only=False)
    assert best["epoch"] in [r["epoch"] for r in resumed.history.records]
    assert best["record"]["val_acc"] == max(r["val_acc"] for r in resumed.history.records)


def test_a_budget_stop_without_out_dir_cannot_go_on(glyphs, monkeypatch):
    tr, va = glyphs
    ten_seconds_a_batch = _fake_clock_objective(monkeypatch)

    t = _trainer(None)
    t.objective = ten_seconds_a_batch
    tl, vl = TensorLoader.from_dataset(tr, 64), TensorLoader.from_dataset(va, 128)
    hist = t.fit(tl, vl, epochs=2, budget_minutes=0.5)  # 3 of the 4 batches of epoch 1
    assert [r["epoch"] for r in hist.records] == [0.75] and t.load_best()["epoch"] == 0.75
    with pytest.raises(ValueError, match=r"^this run stopped inside an epoch \(budget_minutes\) and, without out_dir"):
        t.fit(tl, vl, epochs=2)
